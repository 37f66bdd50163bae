package redisprototest

import (
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/storage"
)

// testHotReplays: the replays of a key after the first that found it done
// cost a GET each, not a SET NX GET (INFO commandstats); a key removed
// (the Inspector's Remove), then in flight again for another owner, then
// removed and acquired anew, answers each time as a store without the
// GET would. Skipped where INFO has no commandstats or goes to one node
// of many.
func testHotReplays(t *testing.T, h Harness) {
	ctx := t.Context()
	info, err := h.Do(ctx, "INFO", "commandstats")
	if err != nil || !strings.Contains(info.Str, "cmdstat_") {
		t.Skip("no INFO commandstats")
	}
	if server, _ := h.Do(ctx, "INFO", "cluster"); strings.Contains(server.Str, "cluster_enabled:1") {
		t.Skip("a cluster: INFO tells one node's commands")
	}
	s := h.New(prefix("hot"))
	acquire(t, s, "k", "owner", storage.Acquired)
	if err := s.Complete(ctx, "k", "owner", []byte("the record"), time.Hour); err != nil {
		t.Fatal(err)
	}
	acquire(t, s, "warm", "owner", storage.Acquired) // the policy's check
	before := commandCalls(t, h)
	const n = 10
	for range n {
		if res := acquire(t, s, "k", "retry", storage.Done); string(res.Record) != "the record" {
			t.Fatalf("replay: %q", res.Record)
		}
	}
	after := commandCalls(t, h)
	if sets, gets := after["set"]-before["set"], after["get"]-before["get"]; sets != 1 || gets != n-1 {
		t.Errorf("%d replays of one key: %d SET and %d GET, want 1 and %d", n, sets, gets, n-1)
	}

	e, err := s.Lookup(ctx, "k", false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Remove(ctx, "k", e.Version); err != nil {
		t.Fatal(err)
	}
	acquire(t, s, "k", "second", storage.Acquired) // GET: no entry; then SET NX GET
	if res := acquire(t, s, "k", "third", storage.InFlight); res.LeaseLeft <= 0 {
		t.Errorf("in flight again: lease left %v, want the second owner's", res.LeaseLeft)
	}
	if err := s.Complete(ctx, "k", "second", []byte("second record"), time.Hour); err != nil {
		t.Fatal(err)
	}
	acquire(t, s, "k", "fourth", storage.Done) // SET NX GET: hot again
	if res := acquire(t, s, "k", "fifth", storage.Done); string(res.Record) != "second record" {
		t.Fatalf("replay after the second run: %q", res.Record)
	}
	e, err = s.Lookup(ctx, "k", false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Remove(ctx, "k", e.Version); err != nil {
		t.Fatal(err)
	}
	if err := s.Issue(ctx, "k", time.Minute); err != nil {
		t.Fatal(err)
	}
	acquire(t, s, "k", "takes the issue", storage.Acquired) // GET: issued; SET NX GET, then the script takes it
}
