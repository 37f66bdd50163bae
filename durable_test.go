package idem_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/memstore"
)

// unconfirmedStore writes every record, as a Redis store does, and then
// answers storage.ErrNotDurable, as one configured to wait for a replica
// that did not acknowledge in time; it counts the Completes.
func unconfirmedStore(mem storage.Store, max int, completes *atomic.Int64) *hookStore {
	return &hookStore{Store: mem, complete: func(ctx context.Context, key, owner string, rec []byte, ttl time.Duration) error {
		completes.Add(1)
		if len(rec) > max {
			return fmt.Errorf("unconfirmed: %w", storage.ErrTooLarge)
		}
		if err := mem.Complete(ctx, key, owner, rec, ttl); err != nil {
			return err
		}
		return fmt.Errorf("unconfirmed: %w: WAIT 1 answered 0", storage.ErrNotDurable)
	}}
}

// A record written whose durability the store could not confirm is a
// stored record: the answer goes out once, Complete is not retried, the
// retry replays it, and the observer's Executed event carries the error
// (NotReplayable for a record refused for its size, its substitute
// unconfirmed).
func TestNotDurableIsStored(t *testing.T) {
	mem := memstore.New()
	defer mem.Close()
	var completes, runs atomic.Int64
	events := make(chan idem.Event, 10)
	m, err := idem.New(unconfirmedStore(mem, 4096, &completes), idem.WithObserver(func(ev idem.Event) { events <- ev }))
	if err != nil {
		t.Fatal(err)
	}
	h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(strings.Repeat("o", int(runs.Load())*3000)))
	}))
	if w := serve(h, "k", ""); w.Code != http.StatusCreated || w.Body.Len() != 3000 {
		t.Fatalf("first: %d, %d bytes", w.Code, w.Body.Len())
	}
	ev := <-events
	if ev.Outcome != idem.Executed || !errors.Is(ev.Err, storage.ErrNotDurable) || ev.Retries != 0 {
		t.Fatalf("event %v %v (retries %d), want executed wrapping storage.ErrNotDurable, no retry", ev.Outcome, ev.Err, ev.Retries)
	}
	if w := serve(h, "k", ""); w.Code != http.StatusCreated || w.Body.Len() != 3000 || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d, %d bytes, replayed %q; want the first answer replayed", w.Code, w.Body.Len(), w.Header().Get("Idempotent-Replayed"))
	}
	if ev := <-events; ev.Outcome != idem.Replayed {
		t.Fatalf("retry's event %v", ev.Outcome)
	}
	if n, c := runs.Load(), completes.Load(); n != 1 || c != 1 {
		t.Fatalf("handler ran %d times, Complete called %d times; want 1 and 1", n, c)
	}

	// Too large, and the not-replayable substitute unconfirmed.
	if w := serve(h, "k2", ""); w.Code != http.StatusCreated || w.Body.Len() != 6000 {
		t.Fatalf("first of k2: %d, %d bytes", w.Code, w.Body.Len())
	}
	ev = <-events
	if ev.Outcome != idem.NotReplayable || !errors.Is(ev.Err, storage.ErrTooLarge) || !errors.Is(ev.Err, storage.ErrNotDurable) {
		t.Fatalf("event %v %v, want not-replayable wrapping ErrTooLarge and ErrNotDurable", ev.Outcome, ev.Err)
	}
	if w := serve(h, "k2", ""); w.Code != http.StatusConflict {
		t.Fatalf("retry of k2: %d, want 409", w.Code)
	}
	if n := runs.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2 (once a key)", n)
	}

	// Do: the result is returned, and replayed.
	fn := func(context.Context) ([]byte, error) { runs.Add(1); return []byte("result"), nil }
	for i := range 2 {
		if got, err := m.Do(context.Background(), "op", "d", fn); err != nil || string(got) != "result" {
			t.Fatalf("Do %d: %q, %v", i, got, err)
		}
	}
	if n := runs.Load(); n != 3 {
		t.Fatalf("handler and fn ran %d times, want 3", n)
	}
}
