//go:build unix

package e2e

import (
	"context"
	"maps"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// The tests of this file test the count the other tests rely on. An
// execution is recorded under its own id (pid-seq) in the hash exec:<key>,
// so a record sent again, as go-redis does after a read timeout, counts
// once, while a second execution, by another process or the same one,
// counts again.

// TestCountIgnoresResentRecords: servers that send every execution's
// record twice (-record-twice, as a go-redis resend would) are counted
// one execution per key, and each of those executions was indeed recorded
// twice.
func TestCountIgnoresResentRecords(t *testing.T) {
	const keys = 300
	addr := redistest.Start(t)
	ctx := deadline(t, time.Minute)
	srvs := startServers(t, 2, "-redis", addr, "-lease", "5s", "-delay", "2ms", "-record-twice")
	rdb := redisClient(t, addr)
	l := newLoad(newClient(t), srvs, loadConfig{prefix: "resent-", dups: 3, workers: 32,
		backoff: 50 * time.Millisecond, maxAttempts: 1000})
	l.start(t, ctx, keys)
	l.wait(t, ctx)
	execs := executions(t, ctx, rdb, l.keys)

	once, executed := checkOnce(t, l, execs)
	once.report("exactly once, every record sent twice")
	resent := resentIDs(t, ctx, rdb)
	var twice int
	for _, key := range l.keys {
		for _, e := range execs[key] {
			if resent[e.id()] {
				twice++
			} else {
				t.Errorf("%s: execution %v was not recorded twice", key, e)
			}
		}
	}
	if executed != keys || twice != keys {
		t.Errorf("%d keys, %d executions counted, %d of them recorded twice; want %d, %d, %d", keys, executed, twice, keys, keys, keys)
	}
	figure(t, "%d keys x %d duplicates over 2 processes recording every execution twice: %d records sent, %d executions counted",
		keys, l.cfg.dups, executed+twice, executed)
}

// TestCountSeesSecondRuns: with a store broken on purpose
// (-steal-leases: Acquire takes a key held by another owner), concurrent
// duplicates run the handler two or more times, in the same process or in
// two. Though every record is sent twice, the count of each key is exactly
// the set of executions the clients saw (answers 201 not replayed), and
// the check of TestExactlyOnceAcrossProcesses reports every key that ran
// more than once.
func TestCountSeesSecondRuns(t *testing.T) {
	const keys = 100
	addr := redistest.Start(t)
	ctx := deadline(t, time.Minute)
	// The handler works 50ms, so that duplicates sent at once overlap.
	srvs := startServers(t, 2, "-redis", addr, "-lease", "5s", "-delay", "50ms", "-record-twice", "-steal-leases")
	rdb := redisClient(t, addr)
	l := newLoad(newClient(t), srvs, loadConfig{prefix: "stolen-", dups: 4, workers: 64,
		backoff: 50 * time.Millisecond, maxAttempts: 1000})
	l.start(t, ctx, keys)
	l.wait(t, ctx)
	execs := executions(t, ctx, rdb, l.keys)
	resent := resentIDs(t, ctx, rdb)

	// What the clients saw: one answer 201 not replayed per execution,
	// named by X-Exec.
	seen := map[string]map[string]bool{}
	for _, r := range l.snapshot() {
		if r.err == nil && r.status == http.StatusCreated && !r.replayed {
			if seen[r.key] == nil {
				seen[r.key] = map[string]bool{}
			}
			seen[r.key][r.exec] = true
		}
	}
	bad := failures{t: t}
	var multi, samePid, twoPids, executed int
	for _, key := range l.keys {
		counted := map[string]bool{}
		pids := map[int]int{}
		for _, e := range execs[key] {
			counted[e.id()] = true
			pids[e.pid]++
			if !resent[e.id()] {
				bad.add("%s: execution %v was not recorded twice", key, e)
			}
		}
		executed += len(counted)
		if !maps.Equal(counted, seen[key]) {
			bad.add("%s: counted %v, the clients saw %v", key, slices.Sorted(maps.Keys(counted)), slices.Sorted(maps.Keys(seen[key])))
		}
		if len(counted) < 2 {
			continue
		}
		multi++
		if len(pids) > 1 {
			twoPids++
		}
		if slices.ContainsFunc(slices.Collect(maps.Values(pids)), func(n int) bool { return n > 1 }) {
			samePid++
		}
	}
	bad.report("count against the executions the clients saw")
	if samePid == 0 || twoPids == 0 {
		t.Errorf("%d keys ran twice in one process, %d in two: the broken store did not show both", samePid, twoPids)
	}
	once, _ := checkOnce(t, l, execs)
	if multi == 0 || once.n < multi {
		t.Errorf("%d keys ran more than once, the exactly-once check reported %d violations: %v", multi, once.n, once.msgs)
	}
	figure(t, "broken store, %d keys x %d duplicates over 2 processes, every record sent twice: %d executions counted, "+
		"all and only those the clients saw; %d keys ran more than once (%d in one process, %d in two), "+
		"and the exactly-once check reported %d violations",
		keys, l.cfg.dups, executed, multi, samePid, twoPids, once.n)
}

// resentIDs returns the ids of the executions whose record was sent a
// second time and found already there (-record-twice).
func resentIDs(t testing.TB, ctx context.Context, rdb *redis.Client) map[string]bool {
	t.Helper()
	ids, err := rdb.SMembers(ctx, "resent").Result()
	if err != nil {
		t.Fatal(err)
	}
	set := make(map[string]bool, len(ids))
	for _, id := range ids {
		set[id] = true
	}
	return set
}
