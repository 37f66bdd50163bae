package idem_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/memstore"
)

// issuerStore is a store whose Issue is replaced by issue.
type issuerStore struct {
	storage.Issuer
	issue func(ctx context.Context, key string, ttl time.Duration) error
}

func (s *issuerStore) Issue(ctx context.Context, key string, ttl time.Duration) error {
	return s.issue(ctx, key, ttl)
}

// A store client that resends an Issue after a timeout gets ErrExists from
// the resend: the key was issued all the same, and IssueKey returns it.
func TestIssueKeyResent(t *testing.T) {
	mem, _ := newMemStore(t)
	store := &issuerStore{Issuer: mem, issue: func(ctx context.Context, key string, ttl time.Duration) error {
		if err := mem.Issue(ctx, key, ttl); err != nil {
			return err
		}
		return mem.Issue(ctx, key, ttl) // the resend's answer
	}}
	m, err := idem.New(store, idem.WithIssuedKeys(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	key, err := m.IssueKey(httptest.NewRequest(http.MethodGet, "/form", nil))
	if err != nil {
		t.Fatalf("IssueKey after a resend: %v", err)
	}
	h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
	if w := serve(h, key, ""); w.Code != http.StatusCreated {
		t.Fatalf("using the key: %d %s", w.Code, w.Body)
	}
	if len(key) != 26 {
		t.Fatalf("key %q: want 26 characters of base32 (128 bits)", key)
	}
}

// IssueKey's errors: a middleware without WithIssuedKeys, a store that
// fails; and New's: a store that cannot issue keys.
func TestIssueKeyErrors(t *testing.T) {
	mem, _ := newMemStore(t)
	r := httptest.NewRequest(http.MethodGet, "/form", nil)
	plain, err := idem.New(mem)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.IssueKey(r); !errors.Is(err, idem.ErrInvalidOption) {
		t.Fatalf("IssueKey without WithIssuedKeys: %v", err)
	}
	down := errors.New("connection refused")
	failing, err := idem.New(&issuerStore{Issuer: mem, issue: func(context.Context, string, time.Duration) error { return down }}, idem.WithIssuedKeys(0))
	if err != nil {
		t.Fatal(err)
	}
	if key, err := failing.IssueKey(r); key != "" || !errors.Is(err, idem.ErrStoreUnavailable) || !errors.Is(err, down) {
		t.Fatalf("IssueKey on a failing store: %q %v", key, err)
	}
	if _, err := idem.New(&hookStore{Store: mem}, idem.WithIssuedKeys(time.Hour)); !errors.Is(err, idem.ErrInvalidOption) {
		t.Fatalf("WithIssuedKeys on a store that is not an Issuer: %v", err)
	}
	if _, err := idem.New(mem, idem.WithIssuedKeys(-time.Second)); !errors.Is(err, idem.ErrInvalidOption) {
		t.Fatalf("WithIssuedKeys(-1s): %v", err)
	}
}

// An issued key is bound to the route of its first use, whatever the
// request comparison: used on another route it gets 422, and never the
// first route's stored page. On the main before this fix, with WithKey
// (no fingerprint) the key issued for /orders, sent to /transfers, got
// /orders' stored page.
func TestIssuedKeyBoundToRoute(t *testing.T) {
	for _, c := range []struct {
		name string
		opts []idem.Option
		send func(r *http.Request, key string)
	}{
		{"form field, no fingerprint", []idem.Option{idem.WithKey(idem.KeyFromForm("idempotency_key"))},
			func(r *http.Request, key string) {}},
		{"header, WithoutFingerprint", []idem.Option{idem.WithoutFingerprint()},
			func(r *http.Request, key string) { r.Header.Set("Idempotency-Key", key) }},
		{"header, custom fingerprint", []idem.Option{idem.WithFingerprint(func(*http.Request, []byte) string { return "same" })},
			func(r *http.Request, key string) { r.Header.Set("Idempotency-Key", key) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			mem, _ := newMemStore(t)
			m, err := idem.New(mem, append([]idem.Option{idem.WithIssuedKeys(time.Hour)}, c.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			var orders, transfers atomic.Int64
			mux := http.NewServeMux()
			mux.Handle("POST /orders", nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				orders.Add(1)
				w.WriteHeader(http.StatusCreated)
				io.WriteString(w, "order 1 placed")
			})))
			mux.Handle("POST /transfers", nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				transfers.Add(1)
				w.WriteHeader(http.StatusCreated)
				io.WriteString(w, "transfer 1 sent")
			})))
			key, err := m.IssueKey(httptest.NewRequest(http.MethodGet, "/form", nil))
			if err != nil {
				t.Fatal(err)
			}
			post := func(path string) *httptest.ResponseRecorder {
				r := httptest.NewRequest(http.MethodPost, path, strings.NewReader("idempotency_key="+key))
				r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				c.send(r, key)
				w := httptest.NewRecorder()
				mux.ServeHTTP(w, r)
				return w
			}
			if w := post("/orders"); w.Code != http.StatusCreated {
				t.Fatalf("first use: %d %s", w.Code, w.Body)
			}
			if w := post("/orders"); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" {
				t.Fatalf("retry on the same route: %d %s", w.Code, w.Body)
			}
			w := post("/transfers")
			if w.Code != http.StatusUnprocessableEntity || strings.Contains(w.Body.String(), "order") || transfers.Load() != 0 || orders.Load() != 1 {
				t.Fatalf("the key on another route: %d %q; orders ran %d, transfers %d; want 422, 1 and 0",
					w.Code, w.Body, orders.Load(), transfers.Load())
			}
		})
	}
}

// IssueKey issues at most WithIssueLimit keys a minute to one scope: past
// it, ErrTooManyKeys (429 with Retry-After), without a store call; another
// scope is not affected; the limit refills with time. On the main before
// this fix every call stored a key, without bound.
func TestIssueLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memstore.New()
		defer mem.Close()
		var issues atomic.Int64
		store := &issuerStore{Issuer: mem, issue: func(ctx context.Context, key string, ttl time.Duration) error {
			issues.Add(1)
			return mem.Issue(ctx, key, ttl)
		}}
		m, err := idem.New(store, idem.WithIssuedKeys(time.Hour), idem.WithIssueLimit(3))
		if err != nil {
			t.Fatal(err)
		}
		alice := httptest.NewRequest(http.MethodGet, "/form", nil)
		alice = alice.WithContext(idem.ContextWithPrincipal(alice.Context(), "alice"))
		bob := httptest.NewRequest(http.MethodGet, "/form", nil)
		bob = bob.WithContext(idem.ContextWithPrincipal(bob.Context(), "bob"))
		for i := range 3 {
			if _, err := m.IssueKey(alice); err != nil {
				t.Fatalf("key %d: %v", i, err)
			}
		}
		_, err = m.IssueKey(alice)
		var e *idem.Error
		if !errors.Is(err, idem.ErrTooManyKeys) || !errors.As(err, &e) || e.Status != http.StatusTooManyRequests || e.RetryAfter < time.Second {
			t.Fatalf("fourth key: %v, want ErrTooManyKeys, 429 with Retry-After", err)
		}
		if issues.Load() != 3 {
			t.Fatalf("%d keys stored, want 3", issues.Load())
		}
		if _, err := m.IssueKey(bob); err != nil {
			t.Fatalf("another scope: %v", err)
		}
		time.Sleep(e.RetryAfter)
		if _, err := m.IssueKey(alice); err != nil {
			t.Fatalf("after Retry-After: %v", err)
		}
		if _, err := idem.New(mem, idem.WithIssuedKeys(time.Hour), idem.WithIssueLimit(0)); !errors.Is(err, idem.ErrInvalidOption) {
			t.Fatalf("WithIssueLimit(0): %v", err)
		}
	})
}
