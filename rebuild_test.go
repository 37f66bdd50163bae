package idem_test

import (
	"context"
	"errors"
	"io"
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

// A retry of a request whose response was not kept gets what WithRebuild's
// function answers from the application's data, marked replayed, and the
// handler does not run again; when the function declines, the usual 409.
func TestRebuild(t *testing.T) {
	mem, _ := newMemStore(t)
	var events []idem.Event
	var seen idem.Info
	orders := map[string]string{} // the application's data, by idempotency key
	m, err := idem.New(mem, idem.WithMaxResponseBody(10),
		idem.WithObserver(func(ev idem.Event) { events = append(events, ev) }),
		idem.WithRebuild(func(w http.ResponseWriter, r *http.Request) bool {
			seen, _ = idem.FromContext(r.Context())
			order, ok := orders[seen.Key]
			if !ok {
				return false
			}
			if b, _ := io.ReadAll(r.Body); string(b) != `{"item":"book"}` {
				t.Errorf("the rebuild got the body %q", b)
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, order)
			return true
		}))
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		key := r.Header.Get("Idempotency-Key")
		if key == "kept" {
			orders[key] = `{"order":1}`
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, strings.Repeat("too large to keep ", 10))
	}))
	for _, key := range []string{"kept", "lost"} {
		if w := serve(h, key, `{"item":"book"}`); w.Code != 201 {
			t.Fatalf("%s: first: %d", key, w.Code)
		}
	}
	w := serve(h, "kept", `{"item":"book"}`)
	if w.Code != 201 || w.Body.String() != `{"order":1}` || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("rebuilt retry: %d %q replayed %q", w.Code, w.Body, w.Header().Get("Idempotent-Replayed"))
	}
	if seen.Protected || seen.StorageKey == "" {
		t.Fatalf("the rebuild's Info %+v", seen)
	}
	w = serve(h, "lost", `{"item":"book"}`)
	if w.Code != 409 || w.Header().Get("Idempotent-Replayed") != "" || !strings.Contains(w.Body.String(), "ErrNotReplayable") {
		t.Fatalf("retry the rebuild declined: %d %q replayed %q", w.Code, w.Body, w.Header().Get("Idempotent-Replayed"))
	}
	if runs.Load() != 2 {
		t.Fatalf("handler ran %d times, want 2", runs.Load())
	}
	var got []idem.Outcome
	for _, ev := range events {
		got = append(got, ev.Outcome)
	}
	want := []idem.Outcome{idem.NotReplayable, idem.NotReplayable, idem.Rebuilt, idem.Conflict}
	if len(got) != len(want) || got[2] != want[2] || got[3] != want[3] || events[2].Status != 201 {
		t.Fatalf("events %v (rebuilt status %d), want %v", got, events[2].Status, want)
	}
}

// committedStore is a memory store with a committed entry, as pgstore has
// one after a fenced transaction whose process died before its Complete:
// every Acquire of a key it has marked answers Committed.
type committedStore struct {
	*memstore.Store
	committed map[string]bool // storage keys
	fp        string
}

func (s *committedStore) Acquire(ctx context.Context, key, owner, fp string, lease time.Duration) (storage.Result, error) {
	if s.committed[key] {
		return storage.Result{State: storage.Committed, Fingerprint: s.fp}, nil
	}
	return s.Store.Acquire(ctx, key, owner, fp, lease)
}

// A committed entry whose response was lost (storage.Committed) is
// answered as a record that was not kept: a request's retry gets 409
// ErrNotReplayable, or WithRebuild's answer when it gives one; a
// request with another body gets 422; Do gets ErrNotReplayable; the
// handler and fn never run.
func TestCommittedEntry(t *testing.T) {
	mem, _ := newMemStore(t)
	store := &committedStore{Store: mem, committed: map[string]bool{}}
	var rebuilt atomic.Int64
	newHandler := func(opts ...idem.Option) (*idem.Middleware, http.Handler) {
		m, err := idem.New(store, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return m, nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			info, _ := idem.FromContext(r.Context())
			// The first execution: its entry is committed, its response lost.
			store.committed[info.StorageKey] = true
			store.fp = ""
			w.WriteHeader(http.StatusCreated)
		}))
	}
	m, h := newHandler(idem.WithoutFingerprint())
	if w := serve(h, "k", `{"item":"book"}`); w.Code != http.StatusCreated {
		t.Fatalf("first: %d", w.Code)
	}
	// The memory store completed the entry, but it answers Committed now.
	w := serve(h, "k", `{"item":"book"}`)
	if w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "ErrNotReplayable") || w.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry of a committed entry: %d %q", w.Code, w.Body)
	}

	_, h = newHandler(idem.WithoutFingerprint(), idem.WithRebuild(func(w http.ResponseWriter, r *http.Request) bool {
		rebuilt.Add(1)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "rebuilt")
		return true
	}))
	w = serve(h, "k", `{"item":"book"}`)
	if w.Code != http.StatusCreated || w.Body.String() != "rebuilt" || w.Header().Get("Idempotent-Replayed") != "true" || rebuilt.Load() != 1 {
		t.Fatalf("retry of a committed entry, with WithRebuild: %d %q %v", w.Code, w.Body, w.Header())
	}

	store.fp = "another request's fingerprint"
	if w := serve(h, "k", `{"item":"book"}`); w.Code != http.StatusUnprocessableEntity {
		t.Fatalf("a committed entry of another request: %d %q, want 422", w.Code, w.Body)
	}

	store.fp = ""
	ran := false
	if _, err := m.Do(context.Background(), "op", "k", func(ctx context.Context) ([]byte, error) {
		info, _ := idem.FromContext(ctx)
		store.committed[info.StorageKey] = true
		return []byte("result"), nil
	}); err != nil {
		t.Fatal(err)
	}
	_, err := m.Do(context.Background(), "op", "k", func(context.Context) ([]byte, error) { ran = true; return nil, nil })
	if !errors.Is(err, idem.ErrNotReplayable) || ran {
		t.Fatalf("Do of a committed entry: %v (fn ran: %v), want ErrNotReplayable", err, ran)
	}
}
