package bench

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/nethttp"
)

// TestIssuedKeyAndDoRoundTrips counts the round trips of a server-issued
// key and of Middleware.Do on the stores with a server: issuing a key
// costs 1; its first use 2, as any first execution (the key is taken in
// the call that takes the lease); a replay 1, and so does a key that was
// never issued. Do costs 2 the first time and 1 for a replay.
func TestIssuedKeyAndDoRoundTrips(t *testing.T) {
	for _, name := range []string{"redis", "postgres"} {
		t.Run(name, func(t *testing.T) {
			st := storeKindNamed(name).open(t, false)
			m, err := idem.New(st.Store, idem.WithIssuedKeys(0))
			if err != nil {
				t.Fatal(err)
			}
			h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusCreated)
			}))
			post := func(key string) int {
				r := httptest.NewRequest(http.MethodPost, "/orders", nil)
				r.Header.Set("Idempotency-Key", key)
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				return w.Code
			}
			get := httptest.NewRequest(http.MethodGet, "/form", nil)
			do := func(key string) {
				if _, err := m.Do(context.Background(), "op", key, func(context.Context) ([]byte, error) { return []byte("r"), nil }); err != nil {
					t.Fatal(err)
				}
			}
			// Warm the connection (scripts, prepared statements).
			k, _ := m.IssueKey(get)
			post(k)
			post(k)
			post("NEVER-ISSUED")
			do("warm")
			do("warm")

			const n = 20
			keys := make([]string, n)
			count := func(what string, want int, op func(i int)) {
				t.Helper()
				st.resetCount()
				for i := range n {
					op(i)
				}
				if got := st.roundTrips(); got != int64(want*n) {
					t.Errorf("%s: %d round trips for %d, want %d each", what, got, n, want)
				}
			}
			count("IssueKey", 1, func(i int) {
				if keys[i], err = m.IssueKey(get); err != nil {
					t.Fatal(err)
				}
			})
			count("first use of an issued key", 2, func(i int) {
				if c := post(keys[i]); c != http.StatusCreated {
					t.Fatalf("first use: %d", c)
				}
			})
			count("replay", 1, func(i int) {
				if c := post(keys[i]); c != http.StatusCreated {
					t.Fatalf("replay: %d", c)
				}
			})
			count("a key never issued", 1, func(i int) {
				if c := post(fmt.Sprintf("NEVER-ISSUED-%d", i)); c != http.StatusBadRequest {
					t.Fatalf("key never issued: %d", c)
				}
			})
			count("Do, first", 2, func(i int) { do(keys[i]) })
			count("Do, replay", 1, func(i int) { do(keys[i]) })
		})
	}
}
