package main

import (
	"io"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/idem/internal/redistest"
	"github.com/idemkit/idem/storage/memstore"
)

// TestDemo runs what `go run ./examples/form -demo` runs, on the memory
// store and on a real Redis.
func TestDemo(t *testing.T) {
	for _, tc := range []struct{ name, redis string }{{"memory", ""}, {"redis", "redis"}} {
		t.Run(tc.name, func(t *testing.T) {
			addr := ""
			if tc.redis != "" {
				addr = redistest.Addr(t)
			}
			var out strings.Builder
			if err := run("", addr, true, &out, io.Discard); err != nil {
				t.Fatalf("%v\n%s", err, out.String())
			}
			for _, want := range []string{
				"# double click, submit 1\nHTTP 200",
				"# Back and submit again\nHTTP 200  Idempotent-Replayed: true\n",
				"# another session sends the same key\nHTTP 400\n",
				"# a new form (a new key): a new order\nHTTP 200\n",
				"2 orders placed for 5 submits",
			} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("the transcript does not show %q:\n%s", want, out.String())
				}
			}
		})
	}
}

// newTestShop serves a shop on the memory store.
func newTestShop(t *testing.T) (*shop, string) {
	store := memstore.New()
	t.Cleanup(func() { store.Close() })
	s, err := newShop(store, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.routes())
	t.Cleanup(srv.Close)
	return s, srv.URL
}

// Many submits of one form at once place one order, and every one of
// them shows its page.
func TestDoubleSubmit(t *testing.T) {
	s, base := newTestShop(t)
	b := newBrowser(base)
	form, err := b.get("/")
	if err != nil {
		t.Fatal(err)
	}
	key := keyIn(form.body)
	const n = 16
	pages := make([]page, n)
	var wg sync.WaitGroup
	for i := range pages {
		wg.Go(func() {
			var err error
			if pages[i], err = b.submit(key); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	replayed := 0
	for _, p := range pages {
		if p.status != 200 || p.body != pages[0].body || !strings.Contains(p.body, "Order 1: 2 x book") {
			t.Fatalf("submit got %v, first %v", p, pages[0])
		}
		if p.replayed {
			replayed++
		}
	}
	if got := s.orders.Load(); got != 1 || replayed != n-1 {
		t.Fatalf("%d orders, %d replayed pages for %d submits", got, replayed, n)
	}
}

// A key is its session's: another session's submit of it is refused and
// does not spend it; a form without a key is refused.
func TestKeyBoundToSession(t *testing.T) {
	s, base := newTestShop(t)
	alice, mallory := newBrowser(base), newBrowser(base)
	form, err := alice.get("/")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mallory.get("/"); err != nil { // a session of her own
		t.Fatal(err)
	}
	key := keyIn(form.body)
	if p, err := mallory.submit(key); err != nil || p.status != 400 || !strings.Contains(p.body, "reload") {
		t.Fatalf("another session's submit: %v %v", p, err)
	}
	if p, err := alice.submit(""); err != nil || p.status != 400 {
		t.Fatalf("no key: %v %v", p, err)
	}
	if p, err := alice.submit(key); err != nil || p.status != 200 || p.replayed {
		t.Fatalf("alice's submit: %v %v", p, err)
	}
	if got := s.orders.Load(); got != 1 {
		t.Fatalf("%d orders", got)
	}
}
