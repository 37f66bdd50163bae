package idem

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/idemkit/idem/storage"
)

type nopStore struct{ storage.Store }

func TestNewRejectsInvalidOptions(t *testing.T) {
	s := nopStore{}
	for name, opt := range map[string]Option{
		"header empty":     WithHeader(""),
		"header colon":     WithHeader("A:B"),
		"methods empty":    WithMethods(),
		"methods GET":      WithMethods("POST", "GET"),
		"ttl zero":         WithTTL(0),
		"lease tiny":       WithLease(time.Millisecond),
		"ttl under lease":  WithTTL(time.Second),
		"wait negative":    WithWait(-1),
		"scope nil":        WithScope(nil),
		"fingerprint nil":  WithFingerprint(nil),
		"request body 0":   WithMaxRequestBody(0),
		"response body -1": WithMaxResponseBody(-1),
		"cacheable nil":    WithCacheable(nil),
		"error writer nil": WithErrorWriter(nil),
		"observer nil":     WithObserver(nil),
	} {
		if _, err := New(s, opt); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%s: New error = %v, want ErrInvalidOption", name, err)
		}
	}
	if _, err := New(nil); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("New(nil) error = %v", err)
	}
	m, err := New(s, WithHeader("x-request-key"), WithMethods("post", "PUT", "DELETE"), WithTTL(time.Hour), WithLease(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if m.cfg.header != "X-Request-Key" || !m.protects("POST") || !m.protects("DELETE") || m.protects("PATCH") {
		t.Fatalf("options not applied: %+v", m.cfg)
	}
}

func TestDefaultCacheable(t *testing.T) {
	for status, want := range map[int]bool{
		100: false, 101: false, 200: true, 201: true, 204: true, 301: true, 304: true,
		400: true, 404: true, 408: false, 409: true, 422: true, 425: false, 429: false,
		500: false, 502: false, 503: false,
	} {
		if got := DefaultCacheable(status); got != want {
			t.Errorf("DefaultCacheable(%d) = %v", status, got)
		}
	}
}

func TestRetrySeconds(t *testing.T) {
	for d, want := range map[time.Duration]int64{
		0: 1, time.Millisecond: 1, time.Second: 1, time.Second + 1: 2, 29*time.Second + 500*time.Millisecond: 30,
	} {
		if got := retrySeconds(d); got != want {
			t.Errorf("retrySeconds(%v) = %d, want %d", d, got, want)
		}
	}
}

func TestErrorIs(t *testing.T) {
	cause := errors.New("dial tcp: refused")
	e := newError(ErrStoreUnavailable, "detail", time.Second, cause)
	if !errors.Is(e, ErrStoreUnavailable) || !errors.Is(e, cause) || errors.Is(e, ErrConflict) {
		t.Fatal("errors.Is does not see Kind and cause")
	}
	if e.Status != http.StatusServiceUnavailable || e.Type() != "https://pkg.go.dev/github.com/idemkit/idem#ErrStoreUnavailable" {
		t.Fatalf("%+v %s", e, e.Type())
	}
	for k := range kinds {
		if newError(k, "", 0, nil).Title == "" {
			t.Errorf("%v has no title", k)
		}
	}
}
