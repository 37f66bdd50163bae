package redisprototest

import (
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/storage"
)

// testNativeSharesEntries: a store on the native path (New) and one on
// the scripts alone (NewScripts: an instance of a release before it) on
// one server, as during a rolling upgrade. Each replays what the other
// completed, byte for byte the same entry; each sees the other's entry in
// flight; and after a lease ran out (the key gone, as when Redis expires
// it) and the other took the key over, the first one's Complete and
// Extend get ErrNotOwner and change nothing, whichever path sent them.
func testNativeSharesEntries(t *testing.T, h Harness) {
	if h.NewScripts == nil {
		t.Skip("no store on the scripts alone")
	}
	ctx := t.Context()
	p := prefix("shared")
	stores := map[string]Store{"native": h.New(p), "scripts": h.NewScripts(p)}
	other := map[string]string{"native": "scripts", "scripts": "native"}
	done := map[string]string{} // the done entry each wrote, without its stamp
	for name, s := range stores {
		o := stores[other[name]]
		k := "done-by-" + name
		acquire(t, s, k, "owner", storage.Acquired)
		if err := s.Extend(ctx, k, "owner", time.Minute); err != nil {
			t.Fatalf("%s: extend: %v", name, err)
		}
		if err := s.Complete(ctx, k, "owner", []byte("the record"), time.Hour); err != nil {
			t.Fatalf("%s: complete: %v", name, err)
		}
		if res := acquire(t, o, k, "another", storage.Done); string(res.Record) != "the record" {
			t.Fatalf("%s replays %s's record as %q", other[name], name, res.Record)
		}
		v, ok := get(t, h, p+k)
		if !ok || len(v) < 8 || v[0] != 'T' {
			t.Fatalf("%s's done entry: %q", name, v)
		}
		done[name] = v[7:]
		if d := pttl(t, h, p+k); d <= 59*time.Minute || d > time.Hour {
			t.Errorf("%s's done entry has TTL %v, want the hour Complete gave", name, d)
		}

		k = "in-flight-by-" + name
		acquire(t, s, k, "first", storage.Acquired)
		acquire(t, o, k, "second", storage.InFlight)

		// The lease ran out: the key is gone, and the other store takes it.
		k = "taken-from-" + name
		acquire(t, s, k, "late", storage.Acquired)
		do(t, h, "DEL", p+k)
		acquire(t, o, k, "taker", storage.Acquired)
		if err := s.Extend(ctx, k, "late", time.Minute); !errors.Is(err, storage.ErrNotOwner) {
			t.Errorf("%s: extend after the takeover: %v, want ErrNotOwner", name, err)
		}
		if err := s.Complete(ctx, k, "late", []byte("late record"), time.Hour); !errors.Is(err, storage.ErrNotOwner) {
			t.Errorf("%s: complete after the takeover: %v, want ErrNotOwner", name, err)
		}
		if err := o.Complete(ctx, k, "taker", []byte("taker's record"), time.Hour); err != nil {
			t.Fatalf("%s: the taker's complete: %v", other[name], err)
		}
		if res := acquire(t, s, k, "third", storage.Done); string(res.Record) != "taker's record" {
			t.Errorf("%s: replayed %q after the takeover, want the taker's record", name, res.Record)
		}
	}
	if done["native"] != done["scripts"] {
		t.Errorf("the native path wrote %q, the script %q: one layout, byte for byte", done["native"], done["scripts"])
	}
}

// acquire acquires key for owner with fingerprint "fp", and wants the
// state want.
func acquire(t *testing.T, s Store, key, owner string, want storage.State) storage.Result {
	t.Helper()
	res, err := s.Acquire(t.Context(), key, owner, "fp", time.Minute)
	if err != nil || res.State != want {
		t.Fatalf("acquire %s for %s: %+v, %v; want %v", key, owner, res, err, want)
	}
	return res
}

// testNativeCommands counts, in INFO commandstats, what first executions
// (an Acquire, an Extend, a Complete) and a Release cost: on a server
// with SET IFEQ, plain SETs and no script but the Release's; on one
// without, one SET refused (the probe) and then the scripts, as before
// the native path. Skipped where INFO has no commandstats (miniredis) or
// the harness sends INFO to one node of many (a cluster).
func testNativeCommands(t *testing.T, h Harness) {
	ctx := t.Context()
	info, err := h.Do(ctx, "INFO", "commandstats")
	if err != nil || !strings.Contains(info.Str, "cmdstat_") {
		t.Skip("no INFO commandstats")
	}
	if server, _ := h.Do(ctx, "INFO", "cluster"); strings.Contains(server.Str, "cluster_enabled:1") {
		t.Skip("a cluster: INFO tells one node's commands")
	}
	native := Native(ctx, h.Do)
	s := h.New(prefix("commands"))
	acquire(t, s, "warm", "o", storage.Acquired) // the policy's check
	const n = 10
	before := commandCalls(t, h)
	for i := range n {
		k := "k" + strconv.Itoa(i)
		acquire(t, s, k, "o", storage.Acquired)
		if err := s.Extend(ctx, k, "o", time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, k, "o", []byte("r"), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Release(ctx, "warm", "o"); err != nil {
		t.Fatal(err)
	}
	after := commandCalls(t, h)
	sets, scripts := after["set"]-before["set"], after["evalsha"]+after["eval"]-before["evalsha"]-before["eval"]
	// commandstats counts the commands a script calls too: the Complete
	// script's SET.
	want := map[bool][2]int64{true: {3 * n, 1}, false: {2*n + 1, 2*n + 1}}[native]
	if sets != want[0] || scripts != want[1] {
		t.Errorf("server with SET IFEQ %v: %d SET and %d scripts for %d first executions and a release, want %d and %d",
			native, sets, scripts, n, want[0], want[1])
	}
}

// commandCalls reads the calls of each command, as INFO commandstats
// tells them ("cmdstat_set:calls=3,..."), refused ones included
// (rejected_calls: Redis counts a syntax error there, not in calls).
func commandCalls(t *testing.T, h Harness) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for line := range strings.Lines(do(t, h, "INFO", "commandstats").Str) {
		name, fields, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		for f := range strings.SplitSeq(fields, ",") {
			k, v, _ := strings.Cut(f, "=")
			if k == "calls" || k == "rejected_calls" {
				n, _ := strconv.ParseInt(v, 10, 64)
				out[strings.TrimPrefix(name, "cmdstat_")] += n
			}
		}
	}
	return out
}

// testRollingUpgradeDuplicates: 64 duplicates of one request at once,
// half through a store on the native path and half through one on the
// scripts alone, on one server. The work runs once; every duplicate gets
// its record (one that found the key in flight waits for the winner's
// Complete and asks again).
func testRollingUpgradeDuplicates(t *testing.T, h Harness) {
	if h.NewScripts == nil {
		t.Skip("no store on the scripts alone")
	}
	ctx := t.Context()
	p := prefix("upgrade")
	stores := [2]Store{h.New(p), h.NewScripts(p)}
	var runs atomic.Int32
	start, completed := make(chan struct{}), make(chan struct{})
	records := make([]string, 64)
	errs := make([]error, 64)
	var wg sync.WaitGroup
	for i := range records {
		wg.Go(func() {
			s, owner := stores[i%2], "owner-"+strconv.Itoa(i)
			<-start
			for attempt := 0; attempt < 2; attempt++ {
				res, err := s.Acquire(ctx, "k", owner, "fp", time.Minute)
				switch {
				case err != nil:
					errs[i] = err
					return
				case res.State == storage.Acquired:
					runs.Add(1)
					rec := "ran by " + owner
					if err := s.Extend(ctx, "k", owner, time.Minute); err != nil {
						errs[i] = err
					} else if err := s.Complete(ctx, "k", owner, []byte(rec), time.Hour); err != nil {
						errs[i] = err
					}
					records[i] = rec
					close(completed)
					return
				case res.State == storage.Done:
					records[i] = string(res.Record)
					return
				case res.State == storage.InFlight:
					<-completed
				default:
					errs[i] = errors.New("state " + res.State.String())
					return
				}
			}
			errs[i] = errors.New("still in flight after the winner completed")
		})
	}
	close(start)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the work ran %d times, want once", n)
	}
	for i, r := range records {
		if r != records[0] {
			t.Fatalf("duplicate %d got %q, duplicate 0 %q: every one gets the winner's record", i, r, records[0])
		}
	}

}
