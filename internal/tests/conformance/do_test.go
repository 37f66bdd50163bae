package conformance

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/dynamotest"
	"github.com/idemkit/idem/internal/leakcheck"
	"github.com/idemkit/idem/internal/mysqltest"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/redistest"
)

// TestMain stops the servers the store kinds started and fails the run if
// a goroutine leaked.
func TestMain(m *testing.M) {
	leakcheck.Main(dynamotest.Wrap(mysqltest.Wrap(pgtest.Wrap(redistest.Wrap(m)))))
}

// TestDo runs Middleware.Do on every store: two middlewares on one store
// stand for two processes of a queue consumer.
func TestDo(t *testing.T) {
	for _, sk := range storeKinds {
		t.Run(sk.name, func(t *testing.T) {
			t.Parallel()
			store, _ := sk.open(t)
			var procs [2]*idem.Middleware
			for i := range procs {
				m, err := idem.New(store, idem.WithWait(30*time.Second), idem.WithLease(5*time.Second))
				if err != nil {
					t.Fatal(err)
				}
				procs[i] = m
			}

			// Every message delivered to both processes, several times at
			// once: one run each, one result for all.
			t.Run("OncePerKeyAcrossProcesses", func(t *testing.T) {
				const keys, deliveries = 20, 4
				var runs [keys]atomic.Int32
				var wg sync.WaitGroup
				errs := make(chan error, keys*deliveries*len(procs))
				for k := range keys {
					for d := range deliveries * len(procs) {
						m := procs[d%len(procs)]
						wg.Go(func() {
							id := fmt.Sprintf("1700000000000-%d", k)
							res, err := m.Do(context.Background(), "orders-stream", id, func(context.Context) ([]byte, error) {
								n := runs[k].Add(1)
								return fmt.Appendf(nil, "message %s applied (run %d)", id, n), nil
							})
							if want := fmt.Sprintf("message %s applied (run 1)", id); err != nil || string(res) != want {
								errs <- fmt.Errorf("delivery of %s: %q %v, want %q", id, res, err, want)
							}
						})
					}
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Error(err)
				}
				for k := range runs {
					if n := runs[k].Load(); n != 1 {
						t.Errorf("message %d applied %d times", k, n)
					}
				}
			})

			// An error releases the key for the other process's
			// redelivery.
			t.Run("ErrorReleases", func(t *testing.T) {
				errBusy := errors.New("downstream busy")
				_, err := procs[0].Do(context.Background(), "op", "k", func(context.Context) ([]byte, error) { return nil, errBusy })
				if !errors.Is(err, errBusy) {
					t.Fatalf("first: %v", err)
				}
				res, err := procs[1].Do(context.Background(), "op", "k", func(context.Context) ([]byte, error) { return []byte("ok"), nil })
				if err != nil || string(res) != "ok" {
					t.Fatalf("redelivery: %q %v", res, err)
				}
				res, err = procs[0].Do(context.Background(), "op", "k", nil)
				if err != nil || string(res) != "ok" {
					t.Fatalf("replay: %q %v", res, err)
				}
			})

			// While one process runs the function, the other's delivery
			// gets ErrConflict when it does not wait.
			t.Run("ConflictWithoutWait", func(t *testing.T) {
				other, err := idem.New(store)
				if err != nil {
					t.Fatal(err)
				}
				entered, proceed := make(chan struct{}), make(chan struct{})
				done := make(chan error)
				go func() {
					_, err := procs[0].Do(context.Background(), "op", "slow", func(context.Context) ([]byte, error) {
						close(entered)
						<-proceed
						return []byte("slow"), nil
					})
					done <- err
				}()
				<-entered
				_, err = other.Do(context.Background(), "op", "slow", nil)
				close(proceed)
				if err := <-done; err != nil {
					t.Fatal(err)
				}
				var e *idem.Error
				if !errors.Is(err, idem.ErrConflict) || !errors.As(err, &e) || e.RetryAfter < time.Second {
					t.Fatalf("delivery while the other runs: %v", err)
				}
			})
		})
	}
}
