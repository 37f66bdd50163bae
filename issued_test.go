package idem_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
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
