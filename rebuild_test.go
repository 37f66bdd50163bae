package idem_test

import (
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/nethttp"
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
	if seen.Protected || seen.StorageKey == "" || seen.TTL != idem.DefaultTTL {
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
