//go:build unix

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/redistest"
)

// TestCrashedProcessLeaseExpires: a process is killed (SIGKILL) while its
// handlers run. Retries on the other processes get 409 with Retry-After
// until the dead process's lease expires, then exactly one of them runs
// the handler and the others get its response; no key stays locked past
// its lease. It runs for each client of the store.
func TestCrashedProcessLeaseExpires(t *testing.T) { eachClient(t, testCrashedProcessLeaseExpires) }

func testCrashedProcessLeaseExpires(t *testing.T, client string) {
	const (
		lease    = 1500 * time.Millisecond
		ttl      = time.Minute
		keys     = 8
		retriers = 3 // concurrent retrying clients per key
	)
	addr := redistest.Start(t)
	ctx := deadline(t, 90*time.Second)
	srvs := startServers(t, 3, "-client", client, "-redis", addr, "-lease", lease.String(), "-ttl", ttl.String())
	rdb := redisClient(t, addr)
	c := newClient(t)
	victim := srvs[0]

	// Requests that block in the handler of the victim.
	var held sync.WaitGroup
	hctx, unhold := context.WithCancel(ctx)
	defer func() { unhold(); held.Wait() }()
	for i := range keys {
		held.Go(func() {
			key := fmt.Sprintf("crash-%d", i)
			if r := c.post(hctx, srvs, 0, key, key+"/held", true); r.err == nil {
				t.Errorf("held request answered before the kill: %v", r)
			}
		})
	}
	// Each handler is running once its execution is counted.
	waitFor(t, ctx, "the held handlers to run", func() bool {
		for i := range keys {
			if n, _ := countExecutions(ctx, rdb, fmt.Sprintf("crash-%d", i)); n != 1 {
				return false
			}
		}
		return true
	})
	// Renewals keep the leases alive while the handlers run (the pause is
	// not a multiple of the renewal period, lease/3, so that the kill
	// falls between two renewals). The victim renews on a real clock: a
	// lease is lost only if no renewal got through for a whole lease,
	// two thirds of it late, which a machine that stalls its processes
	// that long may cause; the test measures its own stalls meanwhile.
	stall := stallDuring(ctx, rdb, lease*7/6, lease/30)
	if inFlight, _ := checkTTLs(t, ctx, rdb, "idem:", lease, ttl); inFlight != keys {
		if stall >= lease/3 {
			t.Skipf("%d keys in flight, want %d; but the machine stalled the test and Redis for %v meanwhile, "+
				"long enough for the victim's renewals of a %v lease to come late: no verdict", inFlight, keys, ms(stall), lease)
		}
		t.Fatalf("%d keys in flight, want %d (the test and Redis stalled at most %v meanwhile)", inFlight, keys, ms(stall))
	}

	// Each key's lease, as Redis counts it just before the kill: it
	// expires no earlier than read+pttl (a renewal in between only puts it
	// off, and none comes after the kill). Read before the kill, not
	// after: a loaded machine could keep the test until a lease has run
	// out.
	first := executions(t, ctx, rdb, keyNames("crash-", keys))
	read := time.Now()
	expiry := map[string]time.Time{}
	iter := rdb.Scan(ctx, 0, "idem:*", 100).Iterator()
	for iter.Next(ctx) {
		v := rdb.Get(ctx, iter.Val()).Val()
		pttl := rdb.PTTL(ctx, iter.Val()).Val()
		for key, ex := range first {
			if strings.HasSuffix(v, ex[0].owner) {
				if pttl <= 0 || pttl > lease {
					t.Errorf("%s: PTTL %v before the kill, want in (0, %v]", key, pttl, lease)
				}
				expiry[key] = read.Add(pttl)
			}
		}
	}
	if len(expiry) != keys {
		if stall >= lease/3 {
			t.Skipf("found the lease of %d keys before the kill, want %d; but the machine stalled the test and Redis for %v, "+
				"long enough for the victim's renewals of a %v lease to come late: no verdict", len(expiry), keys, ms(stall), lease)
		}
		t.Fatalf("found the lease of %d keys before the kill, want %d", len(expiry), keys)
	}

	victim.kill()
	killed := time.Now()
	var left []time.Duration
	for _, e := range expiry {
		left = append(left, e.Sub(killed))
	}

	// Retries on the two other processes, several per key at once, until
	// each gets an answer other than 409; a key still locked long after
	// its lease fails the test.
	rctx, cancel := context.WithTimeout(ctx, 10*lease+15*time.Second)
	defer cancel()
	var (
		mu      sync.Mutex
		replies = map[string][]*reply{}
		finals  = map[string][]*reply{}
		retries sync.WaitGroup
	)
	for i := range keys {
		key := fmt.Sprintf("crash-%d", i)
		for j := range retriers {
			retries.Go(func() {
				for attempt := 0; rctx.Err() == nil; attempt++ {
					r := c.post(rctx, srvs, 1+(i+j+attempt)%2, key, fmt.Sprintf("%s/%d/%d", key, j, attempt), false)
					mu.Lock()
					replies[key] = append(replies[key], r)
					mu.Unlock()
					if r.err != nil || r.status != http.StatusConflict {
						mu.Lock()
						finals[key] = append(finals[key], r)
						mu.Unlock()
						return
					}
					sleep(rctx, 20*time.Millisecond)
				}
			})
		}
	}
	retries.Wait()
	if rctx.Err() != nil {
		t.Fatalf("keys still locked %v after the kill", time.Since(killed).Round(time.Second))
	}

	execs := executions(t, ctx, rdb, keyNames("crash-", keys))
	bad := failures{t: t}
	var n409 int
	var reran []time.Duration
	// Retries answered before their key's lease had run out: each had to
	// be a 409. None means the machine took the whole lease left at the
	// kill to get a retry answered: the lease was not exercised.
	var early int
	firstAnswer := time.Duration(-1)
	for i := range keys {
		key := fmt.Sprintf("crash-%d", i)
		var orig *reply
		for _, r := range replies[key] {
			if r.err == nil {
				if r.recv.Before(expiry[key]) {
					early++
				}
				if d := r.recv.Sub(killed); firstAnswer < 0 || d < firstAnswer {
					firstAnswer = d
				}
			}
			switch {
			case r.err != nil:
				bad.add("%v", r)
			case r.status == http.StatusConflict:
				n409++
				if err := checkRetryAfter(r, lease); err != nil {
					bad.add("%v", err)
				}
			case r.status != http.StatusCreated:
				bad.add("unexpected answer %v", r)
			case r.replayed:
			case orig != nil:
				bad.add("%s: executed twice after the kill: %v and %v", key, orig, r)
			default:
				orig = r
				if r.recv.Before(expiry[key]) {
					bad.add("%s: executed %v after the kill, before its lease expired (%v after the kill): %v",
						key, r.recv.Sub(killed), expiry[key].Sub(killed), r)
				}
				reran = append(reran, r.recv.Sub(killed))
			}
		}
		ex := execs[key]
		switch {
		case len(ex) != 2:
			bad.add("%s: %d executions, want 2 (the killed one and one after): %v", key, len(ex), ex)
		case ex[1].pid == victim.pid || ex[1].owner == ex[0].owner:
			bad.add("%s: second execution %v by the killed process or owner", key, ex[1])
		case orig == nil:
			bad.add("%s: no retry got the executed answer: %v", key, finals[key])
		case orig.exec != ex[1].id():
			bad.add("%s: executed answer %v is not from the execution %v", key, orig, ex[1])
		default:
			for _, r := range finals[key] {
				if r != orig && (!r.replayed || !r.sameResponse(orig)) {
					bad.add("%s: replay %v differs from the executed answer %v", key, r, orig)
				}
			}
		}
	}
	bad.report("after the crash")
	noVerdict := ""
	switch {
	case n409 > 0:
	case early > 0:
		t.Errorf("no retry got 409, though %d were answered before their key's lease ran out", early)
	default:
		noVerdict = fmt.Sprintf("no retry was answered before its key's lease ran out (the first answer came %v after the kill, "+
			"the leases left then %v to %v): a loaded machine; the test did not exercise the lease, no verdict on it",
			ms(firstAnswer), ms(slices.Min(left)), ms(slices.Max(left)))
	}
	if inFlight, done := checkTTLs(t, ctx, rdb, "idem:", lease, ttl); inFlight != 0 || done != keys {
		t.Errorf("%d keys in flight and %d done, want 0 and %d", inFlight, done, keys)
	}
	figure(t, "lease %v, %d keys held by the killed process, %d retriers per key: %d answered 409 with Retry-After; "+
		"leases left at the kill %v to %v; each key ran again exactly once, %v to %v after the kill",
		lease, keys, retriers, n409, ms(slices.Min(left)), ms(slices.Max(left)), ms(slices.Min(reran)), ms(slices.Max(reran)))
	if noVerdict != "" {
		t.Skip(noVerdict)
	}
}

func keyNames(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return keys
}
