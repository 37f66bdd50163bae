package idem_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
)

// keeperStore is a storage.RecordKeeper over a memory store that remembers
// every buffer it was handed, with a copy of its content at the time, and
// can fail CompleteKeep a few times first.
type keeperStore struct {
	storage.RecordKeeper
	fails    atomic.Int32
	complete atomic.Int32 // calls of Complete, which the middleware should not make

	mu   sync.Mutex
	kept [][2][]byte // the buffer, and its content when handed over
}

var errBlip = errors.New("blip")

func (s *keeperStore) Complete(ctx context.Context, key, owner string, rec []byte, ttl time.Duration) error {
	s.complete.Add(1)
	return s.RecordKeeper.Complete(ctx, key, owner, rec, ttl)
}

func (s *keeperStore) CompleteKeep(ctx context.Context, key, owner string, rec []byte, ttl time.Duration) error {
	if s.fails.Add(-1) >= 0 {
		return errBlip
	}
	err := s.RecordKeeper.CompleteKeep(ctx, key, owner, rec, ttl)
	if err == nil {
		s.mu.Lock()
		s.kept = append(s.kept, [2][]byte{rec, bytes.Clone(rec)})
		s.mu.Unlock()
	}
	return err
}

// TestRecordHandedOver: with a store that implements storage.RecordKeeper,
// the middleware completes through CompleteKeep, never touches a buffer it
// handed over again (later requests, of every size, reuse none of them),
// and replays from it.
func TestRecordHandedOver(t *testing.T) {
	mem, _ := newMemStore(t)
	store := &keeperStore{RecordKeeper: mem}
	m, err := idem.New(store)
	if err != nil {
		t.Fatal(err)
	}
	h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		w.Write(bytes.Repeat(body, 1+len(body)%7))
	}))
	for i := range 40 {
		body := bytes.Repeat([]byte{'a' + byte(i%26)}, 1+i*i*37)
		if w := serve(h, "k"+strconv.Itoa(i), string(body)); w.Code != http.StatusCreated {
			t.Fatalf("request %d: %d", i, w.Code)
		}
	}
	for i := range 40 {
		body := bytes.Repeat([]byte{'a' + byte(i%26)}, 1+i*i*37)
		w := serve(h, "k"+strconv.Itoa(i), string(body))
		if w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" || !bytes.Equal(w.Body.Bytes(), bytes.Repeat(body, 1+len(body)%7)) {
			t.Fatalf("replay %d: %d %v, %d bytes", i, w.Code, w.Header(), w.Body.Len())
		}
	}
	store.mu.Lock()
	defer store.mu.Unlock()
	if len(store.kept) != 40 || store.complete.Load() != 0 {
		t.Fatalf("%d records handed over and %d completed by Complete, want 40 and 0", len(store.kept), store.complete.Load())
	}
	for i, k := range store.kept {
		if !bytes.Equal(k[0], k[1]) {
			t.Fatalf("record %d was modified after it was handed over", i)
		}
	}
}

// TestCompleteKeepRetried: CompleteKeep failing for a moment after the
// handler is retried in the background, as Complete is, with the same
// record, and a retry then replays.
func TestCompleteKeepRetried(t *testing.T) {
	mem, _ := newMemStore(t)
	store := &keeperStore{RecordKeeper: mem}
	store.fails.Store(2)
	events := make(chan idem.Event, 4)
	m, err := idem.New(store, idem.WithObserver(func(e idem.Event) { events <- e }))
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "made")
	}))
	if w := serve(h, "k", ""); w.Code != http.StatusCreated {
		t.Fatalf("first: %d", w.Code)
	}
	if ev := <-events; ev.Outcome != idem.Executed || ev.Err != nil {
		t.Fatalf("event %+v, want executed once the retries succeeded", ev)
	}
	w := serve(h, "k", "")
	if w.Code != http.StatusCreated || w.Body.String() != "made" || w.Header().Get("Idempotent-Replayed") != "true" || runs.Load() != 1 {
		t.Fatalf("retry %d %q %v, runs %d", w.Code, w.Body, w.Header(), runs.Load())
	}
}
