package idem_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/nethttp"
)

// A duplicate that waits (WithWait) for the first request, whose client
// gives up meanwhile, is not a store failure: with WithFailOpen it must not
// run the handler unprotected (on the main before this fix it did: the
// handler ran twice with a healthy store), and the observer is told
// Canceled, not store-error (which inflated outage metrics). A deadline set
// before idem gets the same treatment, and its client, still there, gets a
// 503 ErrCanceled problem.
func TestCanceledWaitIsNotAStoreFailure(t *testing.T) {
	for _, tc := range []struct {
		name     string
		failOpen bool
		deadline bool // a deadline set by middleware before idem, instead of the client giving up
	}{
		{"client gives up", false, false},
		{"client gives up, fail-open", true, false},
		{"deadline before idem, fail-open", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem, _ := newMemStore(t)
			events := make(chan idem.Event, 10)
			opts := []idem.Option{idem.WithWait(3 * time.Second), idem.WithObserver(func(ev idem.Event) { events <- ev })}
			if tc.failOpen {
				opts = append(opts, idem.WithFailOpen())
			}
			m, err := idem.New(mem, opts...)
			if err != nil {
				t.Fatal(err)
			}
			var runs atomic.Int64
			entered, proceed := make(chan struct{}), make(chan struct{})
			var h http.Handler = nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if runs.Add(1) == 1 {
					close(entered)
					<-proceed
				}
				w.WriteHeader(http.StatusCreated)
			}))
			if tc.deadline {
				inner := h
				h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.Header.Get("X-Deadline") != "" {
						ctx, cancel := context.WithTimeout(r.Context(), 200*time.Millisecond)
						defer cancel()
						r = r.WithContext(ctx)
					}
					inner.ServeHTTP(w, r)
				})
			}
			srv := httptest.NewServer(h)
			t.Cleanup(srv.Close)
			var release sync.Once
			open := func() { release.Do(func() { close(proceed) }) }
			t.Cleanup(open) // a failed test must not leave the first request waiting
			post := func(ctx context.Context, header ...string) (*http.Response, error) {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/orders", nil)
				req.Header.Set("Idempotency-Key", "k")
				for i := 0; i < len(header); i += 2 {
					req.Header.Set(header[i], header[i+1])
				}
				return srv.Client().Do(req)
			}
			first := make(chan int)
			go func() {
				res, err := post(context.Background())
				if err != nil {
					t.Error(err)
					first <- 0
					return
				}
				res.Body.Close()
				first <- res.StatusCode
			}()
			<-entered

			if tc.deadline {
				res, err := post(context.Background(), "X-Deadline", "1")
				if err != nil {
					t.Fatal(err)
				}
				var p struct{ Type string }
				json.NewDecoder(res.Body).Decode(&p)
				res.Body.Close()
				if res.StatusCode != 503 || p.Type != "https://pkg.go.dev/github.com/idemkit/idem#ErrCanceled" || res.Header.Get("Retry-After") == "" {
					t.Fatalf("duplicate past its deadline: %d %q Retry-After %q", res.StatusCode, p.Type, res.Header.Get("Retry-After"))
				}
			} else {
				ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
				_, err := post(ctx)
				cancel()
				if err == nil {
					t.Fatal("the client that gave up got an answer")
				}
			}
			select {
			case ev := <-events:
				if ev.Outcome != idem.Canceled || !errors.Is(ev.Err, idem.ErrCanceled) || !errors.Is(ev.Err, context.Canceled) && !errors.Is(ev.Err, context.DeadlineExceeded) {
					t.Fatalf("duplicate's event: %v %v, want canceled with the context's error", ev.Outcome, ev.Err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("no event for the duplicate")
			}
			if n := runs.Load(); n != 1 {
				t.Fatalf("handler ran %d times while the first was in flight, want 1", n)
			}
			open()
			if st := <-first; st != 201 {
				t.Fatalf("first request: %d", st)
			}
			if ev := <-events; ev.Outcome != idem.Executed {
				t.Fatalf("first request's event %v", ev.Outcome)
			}
			res, err := post(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != 201 || res.Header.Get("Idempotent-Replayed") != "true" || runs.Load() != 1 {
				t.Fatalf("retry: %d replayed %q, handler ran %d times", res.StatusCode, res.Header.Get("Idempotent-Replayed"), runs.Load())
			}
		})
	}
}
