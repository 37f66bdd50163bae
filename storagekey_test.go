package idem_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/memstore"
)

// TestStorageKeyIsInfoStorageKey: what StorageKey, IssuedStorageKey and
// OperationStorageKey compute is the key of the entry the middleware
// makes, which an Inspector then finds.
func TestStorageKeyIsInfoStorageKey(t *testing.T) {
	store := memstore.New()
	defer store.Close()
	seen := make(chan string, 1)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, _ := idem.FromContext(r.Context())
		seen <- info.StorageKey
		w.WriteHeader(http.StatusCreated)
	})
	send := func(m *idem.Middleware, key string) {
		t.Helper()
		mux := http.NewServeMux()
		mux.Handle("POST /orders", nethttp.Middleware(m)(handler))
		r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader("{}"))
		r.Header.Set("Authorization", "Bearer alice")
		r = r.WithContext(idem.ContextWithPrincipal(r.Context(), "alice")) // the authentication's
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		if w.Code != http.StatusCreated {
			t.Fatalf("status %d %s", w.Code, w.Body)
		}
	}
	lookup := func(key string) {
		t.Helper()
		if e, err := store.Lookup(context.Background(), key, false); err != nil || e.State != storage.Done {
			t.Fatalf("Lookup(%q): %+v, %v; want the done entry", key, e, err)
		}
	}

	m, err := idem.New(store)
	if err != nil {
		t.Fatal(err)
	}
	send(m, "order-42")
	want := idem.StorageKey("alice", http.MethodPost, "POST /orders", "order-42")
	if got := <-seen; got != want {
		t.Fatalf("Info.StorageKey %q, StorageKey %q", got, want)
	}
	lookup(want)
	if other := idem.StorageKey("bob", http.MethodPost, "POST /orders", "order-42"); other == want {
		t.Fatal("another scope, the same storage key")
	}

	issuing, err := idem.New(store, idem.WithIssuedKeys(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodGet, "/form", nil)
	r.Header.Set("Authorization", "Bearer alice")
	r = r.WithContext(idem.ContextWithPrincipal(r.Context(), "alice"))
	key, err := issuing.IssueKey(r)
	if err != nil {
		t.Fatal(err)
	}
	send(issuing, key)
	if got, want := <-seen, idem.IssuedStorageKey("alice", key); got != want {
		t.Fatalf("issued: Info.StorageKey %q, IssuedStorageKey %q", got, want)
	}
	lookup(idem.IssuedStorageKey("alice", key))

	if _, err := m.Do(context.Background(), "payments", "pay-1", func(ctx context.Context) ([]byte, error) {
		info, _ := idem.FromContext(ctx)
		seen <- info.StorageKey
		return []byte("ok"), nil
	}); err != nil {
		t.Fatal(err)
	}
	if got, want := <-seen, idem.OperationStorageKey("", "payments", "pay-1"); got != want {
		t.Fatalf("Do: Info.StorageKey %q, OperationStorageKey %q", got, want)
	}
	lookup(idem.OperationStorageKey("", "payments", "pay-1"))
}
