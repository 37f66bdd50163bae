package idem_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
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

// limitStore refuses, as sqlstore does over max_allowed_packet, every
// record longer than max with storage.ErrTooLarge; outages, when > 0, is
// how many Completes fail as an outage first.
func limitStore(mem storage.Store, max int, outages int64) *hookStore {
	var left atomic.Int64
	left.Store(outages)
	return &hookStore{Store: mem, complete: func(ctx context.Context, key, owner string, rec []byte, ttl time.Duration) error {
		if left.Add(-1) >= 0 {
			return errors.New("connection refused")
		}
		if len(rec) > max {
			return fmt.Errorf("limitstore: %w: %d bytes", storage.ErrTooLarge, len(rec))
		}
		return mem.Complete(ctx, key, owner, rec, ttl)
	}}
}

// A response the store refuses for its size is sent, and the key stays
// done: retries get 409 ErrNotReplayable and the handler runs once, not
// once a lease (issue 36: sqlstore's ErrRecordTooLarge was retried as an
// outage, then the key freed, and the third attempt ran the handler
// again). Whether the refusal comes at once or after an outage that the
// background retries ride out.
func TestRecordTooLargeStaysDone(t *testing.T) {
	for _, outages := range []int64{0, 2} {
		t.Run(fmt.Sprintf("outages=%d", outages), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mem := memstore.New()
				defer mem.Close()
				events := make(chan idem.Event, 10)
				m, err := idem.New(limitStore(mem, 512, outages), idem.WithLease(time.Second),
					idem.WithObserver(func(ev idem.Event) { events <- ev }))
				if err != nil {
					t.Fatal(err)
				}
				var runs atomic.Int64
				body := strings.Repeat("x", 2048)
				h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					runs.Add(1)
					w.WriteHeader(http.StatusCreated)
					w.Write([]byte(body))
				}))
				if w := serve(h, "k", ""); w.Code != http.StatusCreated || w.Body.String() != body {
					t.Fatalf("first: %d, %d bytes", w.Code, w.Body.Len())
				}
				ev := <-events
				if ev.Outcome != idem.NotReplayable || !errors.Is(ev.Err, storage.ErrTooLarge) {
					t.Fatalf("event %v %v, want not-replayable wrapping storage.ErrTooLarge", ev.Outcome, ev.Err)
				}
				// Long past the lease: a key released for an outage would be free.
				time.Sleep(3 * time.Second)
				for i := range 3 {
					w := serve(h, "k", "")
					if w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "ErrNotReplayable") {
						t.Fatalf("retry %d: %d %q, want 409 ErrNotReplayable", i, w.Code, w.Body)
					}
				}
				if n := runs.Load(); n != 1 {
					t.Fatalf("handler ran %d times, want 1", n)
				}
			})
		})
	}
}

// Do's result the store refuses for its size is returned, and the next
// Do with the key gets ErrNotReplayable without running fn.
func TestDoResultTooLargeStaysDone(t *testing.T) {
	mem := memstore.New()
	defer mem.Close()
	m, err := idem.New(limitStore(mem, 512, 0))
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	fn := func(context.Context) ([]byte, error) { runs++; return make([]byte, 4096), nil }
	if got, err := m.Do(context.Background(), "op", "k", fn); err != nil || len(got) != 4096 {
		t.Fatalf("first Do: %d bytes, %v", len(got), err)
	}
	if _, err := m.Do(context.Background(), "op", "k", fn); !errors.Is(err, idem.ErrNotReplayable) {
		t.Fatalf("second Do: %v, want ErrNotReplayable", err)
	}
	if runs != 1 {
		t.Fatalf("fn ran %d times, want 1", runs)
	}
}
