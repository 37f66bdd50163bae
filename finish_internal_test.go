package idem

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idem/internal/httprec"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/memstore"
)

// failingComplete is a store whose Complete always fails, as Redis at
// maxmemory does.
type failingComplete struct{ storage.Store }

func (failingComplete) Complete(context.Context, string, string, []byte, time.Duration) error {
	return errors.New("OOM command not allowed when used memory > 'maxmemory'")
}

// A record that cannot be encoded neither stays locked nor is lost: the
// key is released when nothing was sent, and kept as done but not
// replayable when the response went out. On the main before this fix the
// key stayed locked until its lease ended either way.
func TestKeepUnencodableRecord(t *testing.T) {
	for _, sent := range []bool{false, true} {
		mem := memstore.New()
		defer mem.Close()
		var events []Event
		m, err := New(mem, WithObserver(func(e Event) { events = append(events, e) }))
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if res, err := mem.Acquire(ctx, "k", "owner-1", "", time.Minute); err != nil || res.State != storage.Acquired {
			t.Fatal(res, err)
		}
		e := &execution{finish: finish{m: m, caller: ctx, skey: "k", owner: "owner-1"}}
		e.keep(&httprec.Record{Status: 0}, true, 0, sent, nil) // status 0 cannot be encoded
		res, err := mem.Acquire(ctx, "k", "owner-2", "", time.Minute)
		switch {
		case err != nil:
			t.Fatal(err)
		case !sent && (res.State != storage.Acquired || len(events) != 1 || events[0].Outcome != Released):
			t.Fatalf("nothing sent: %v, events %v; want the key released", res.State, events)
		case sent && (res.State != storage.Done || len(events) != 1 || events[0].Outcome != NotReplayable):
			t.Fatalf("sent: %v, events %v; want the key done", res.State, events)
		}
		if sent {
			var rec httprec.Record
			if err := rec.UnmarshalBinary(res.Record); err != nil || !rec.NotReplayable {
				t.Fatalf("stored %+v %v, want not replayable", rec, err)
			}
		}
	}
}

// The background retries are bounded: past the bound an execution whose
// record the store refused is not retried, and its event says so at once
// (StoreError with ErrRetryDropped and the store's error).
func TestBackgroundRetriesBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memstore.New()
		defer mem.Close()
		events := make(chan Event, 4)
		m, err := New(failingComplete{mem}, WithObserver(func(e Event) { events <- e }))
		if err != nil {
			t.Fatal(err)
		}
		m.pending.max, m.pending.maxBytes = 1, 1<<20
		ctx := context.Background()
		for i, owner := range []string{"owner-1", "owner-2"} {
			key := []string{"k1", "k2"}[i]
			if _, err := mem.Acquire(ctx, key, owner, "", time.Minute); err != nil {
				t.Fatal(err)
			}
			e := &execution{finish: finish{m: m, caller: ctx, skey: key, owner: owner}}
			e.keep(&httprec.Record{Status: 201}, true, 201, true, nil)
		}
		ev := <-events // the second, at once
		if ev.Outcome != StoreError || !errors.Is(ev.Err, ErrRetryDropped) {
			t.Fatalf("event %v %v, want store-error with ErrRetryDropped", ev.Outcome, ev.Err)
		}
		if err := m.Shutdown(ctx); err != nil { // the first gives up after its lease
			t.Fatal(err)
		}
		if ev := <-events; ev.Outcome != StoreError || errors.Is(ev.Err, ErrRetryDropped) {
			t.Fatalf("event %v %v, want the first's store-error after its retries", ev.Outcome, ev.Err)
		}
		if m.pending.n != 0 || m.pending.bytes != 0 {
			t.Fatalf("pending %d, %d bytes after Shutdown", m.pending.n, m.pending.bytes)
		}
	})
}
