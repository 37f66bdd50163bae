package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/slowclock"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
	"github.com/jackc/pgx/v5"
)

// unreachable wraps a store whose Complete never gets through (a network
// error, retried by the middleware until the lease has passed), as when
// the process dies, or loses the database, right after the handler.
type unreachable struct{ storage.Store }

func (unreachable) Complete(context.Context, string, string, []byte, time.Duration) error {
	return errors.New("connection reset by peer")
}

// TestMiddlewareCommitThenNoRecord (f): through nethttp on a real server,
// a handler inserts an order and fences in one transaction; its response
// never reaches the store, and the lease ends. The retry gets 409
// ErrNotReplayable, and there is exactly one order. Without the fence (the
// control), the retry runs the handler again and the order exists twice:
// the failure the fence exists for.
func TestMiddlewareCommitThenNoRecord(t *testing.T) {
	for _, c := range []struct {
		name       string
		fence      bool
		wantOrders int
		wantRetry  int
	}{
		{"with Fence", true, 1, http.StatusConflict},
		{"without Fence", false, 2, http.StatusCreated},
	} {
		t.Run(c.name, func(t *testing.T) {
			pool := testPool(t)
			d := openOn(t, pool)
			// The handler fences in the lease, which the middleware
			// renews on a real clock (lease/3): on a loaded machine a
			// renewal may come too late, and the Fence is refused. The
			// test sees it (leaseLog) and tries again with a longer
			// lease.
			attempt := 0
			inTime(t, 100*time.Millisecond, func(lease time.Duration) bool {
				attempt++
				orders := pgx.Identifier{testTable(t, pool)}.Sanitize()
				d.exec("CREATE TABLE " + orders + " (id serial PRIMARY KEY)")
				log := &leaseLog{Store: slowclock.Store{Store: d.store}}
				m, err := idem.New(unreachable{log}, idem.WithLease(lease), idem.WithTTL(time.Hour))
				if err != nil {
					t.Fatal(err)
				}
				var runs atomic.Int64
				var mu sync.Mutex // the handler's Fence: its error, and when it returned
				var fenceErr error
				var fenced time.Time
				mux := http.NewServeMux()
				mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
					runs.Add(1)
					ctx := r.Context()
					err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
						if _, err := tx.Exec(ctx, "INSERT INTO "+orders+" DEFAULT VALUES"); err != nil {
							return err
						}
						if c.fence {
							err := d.store.Fence(ctx, tx)
							mu.Lock()
							fenceErr, fenced = err, time.Now()
							mu.Unlock()
							return err
						}
						return nil
					})
					if err != nil {
						http.Error(w, err.Error(), http.StatusInternalServerError)
						return
					}
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusCreated)
					io.WriteString(w, `{"id":1}`)
				})
				srv := httptest.NewServer(nethttp.Middleware(m)(mux))
				defer srv.Close()
				key := fmt.Sprintf(`"order-%d"`, attempt)
				post := func() (int, string) {
					t.Helper()
					req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader("{}"))
					req.Header.Set("Idempotency-Key", key)
					resp, err := srv.Client().Do(req)
					if err != nil {
						t.Fatal(err)
					}
					defer resp.Body.Close()
					b, _ := io.ReadAll(resp.Body)
					return resp.StatusCode, string(b)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				defer m.Shutdown(ctx)
				if code, body := post(); code != http.StatusCreated {
					mu.Lock()
					late := errors.Is(fenceErr, storage.ErrNotOwner) && log.lapsed(lease, fenced)
					mu.Unlock()
					if late {
						return false
					}
					t.Fatalf("first: %d %s", code, body)
				}
				// The middleware retries storing the response for one lease and
				// gives up: the entry is left as the handler's transaction left
				// it, and the lease is over.
				if err := m.Shutdown(ctx); err != nil {
					t.Fatal(err)
				}
				d.shift(lease)
				code, body := post()
				if code != c.wantRetry || (c.fence && !strings.Contains(body, "#ErrNotReplayable")) {
					t.Fatalf("retry: %d %s, want %d", code, body, c.wantRetry)
				}
				var n int
				if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+orders).Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n != c.wantOrders || runs.Load() != int64(c.wantOrders) {
					t.Fatalf("%d orders, %d runs of the handler, want %d", n, runs.Load(), c.wantOrders)
				}
				if err := m.Shutdown(ctx); err != nil {
					t.Fatal(err)
				}
				return true
			})
		})
	}
}
