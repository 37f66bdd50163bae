//go:build unix

package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/redistest"
)

// storeClients are the Redis clients of idemserver's store (its -client):
// redisstore on go-redis, rueidisstore on rueidis.
var storeClients = []string{"go-redis", "rueidis"}

// eachClient runs f as a subtest for each client of the store, whose name
// it passes to idemserver's -client.
func eachClient(t *testing.T, f func(t *testing.T, client string)) {
	for _, c := range storeClients {
		t.Run(c, func(t *testing.T) { f(t, c) })
	}
}

// TestExactlyOnceAcrossProcesses: three processes share one Redis; every
// key is sent as concurrent duplicates spread across them. Each key's
// handler runs exactly once, and every other duplicate gets that
// execution's response back byte for byte. It runs for each client of the
// store.
func TestExactlyOnceAcrossProcesses(t *testing.T) { eachClient(t, testExactlyOnceAcrossProcesses) }

func testExactlyOnceAcrossProcesses(t *testing.T, client string) {
	const lease = 5 * time.Second
	addr := redistest.Start(t)
	keys := envInt(t, "IDEM_E2E_KEYS", 2000)
	dups := envInt(t, "IDEM_E2E_DUPS", 5)
	workers := envInt(t, "IDEM_E2E_WORKERS", 64)
	ctx := deadline(t, 2*time.Minute+time.Duration(keys*dups)*2*time.Millisecond)

	srvs := startServers(t, 3, "-client", client, "-redis", addr, "-lease", lease.String(), "-delay", "2ms")
	rdb := redisClient(t, addr)
	l := newLoad(newClient(t), srvs, loadConfig{prefix: "once-", dups: dups, workers: workers,
		backoff: 50 * time.Millisecond, maxAttempts: 1000})
	begin := time.Now()
	l.start(t, ctx, keys)
	l.wait(t, ctx)
	elapsed := time.Since(begin)

	replies := l.snapshot()
	execs := executions(t, ctx, rdb, l.keys)
	if int(l.started.Load()) != keys {
		t.Fatalf("%d keys sent, want %d", l.started.Load(), keys)
	}

	// Every answer is the handler's 201 (executed or replayed) or a 409
	// with Retry-After; the store never failed.
	checkAnswers(t, srvs, replies, lease)

	// One execution per key, and every duplicate's final answer is that
	// execution's response, byte for byte.
	once, executed := checkOnce(t, l, execs)
	once.report("exactly once")
	if n := rdb.SCard(ctx, "lost").Val(); n != 0 {
		t.Errorf("%d records could not be stored; servers said:\n%s\n%s\n%s", n, srvs[0].output(), srvs[1].output(), srvs[2].output())
	}
	if _, done := checkTTLs(t, ctx, rdb, "idem:", lease, 10*time.Minute); done != keys {
		t.Errorf("%d records stored, want %d", done, keys)
	}

	figure(t, "%d keys x %d duplicates over 3 processes, %d in flight: %d requests, %d answered 409 and retried, "+
		"%d executions, %d replays, in %v (%.0f requests/s)",
		keys, dups, workers, len(replies), l.n409.Load(), executed, keys*dups-int(l.nExecuted.Load()),
		ms(elapsed), float64(len(replies))/elapsed.Seconds())
}

// checkOnce checks that every key of l ran once, counted in execs, and
// that every duplicate's final answer is that execution's response, byte
// for byte; it returns the violations, not yet reported, and the number
// of executions.
func checkOnce(t testing.TB, l *load, execs map[string][]execution) (once failures, executed int) {
	once = failures{t: t}
	for _, key := range l.keys {
		ex := execs[key]
		executed += len(ex)
		if len(ex) != 1 {
			once.add("%s executed %d times: %v", key, len(ex), ex)
			continue
		}
		finals := l.finals[key]
		if len(finals) != l.cfg.dups {
			once.add("%s: %d final answers, want %d", key, len(finals), l.cfg.dups)
			continue
		}
		var orig *reply
		for _, r := range finals {
			if r.status == http.StatusCreated && !r.replayed {
				if orig != nil {
					once.add("%s: two answers not replayed: %v and %v", key, orig, r)
				}
				orig = r
			}
		}
		switch {
		case orig == nil:
			once.add("%s: no duplicate got the executed answer: %v", key, finals)
			continue
		case orig.exec != ex[0].id() || orig.rid != ex[0].rid:
			once.add("%s: executed answer %v is not from the execution %v", key, orig, ex[0])
		}
		for _, r := range finals {
			if r != orig && (!r.replayed || !r.sameResponse(orig)) {
				once.add("%s: replay %v differs from the executed answer %v", key, r, orig)
			}
		}
	}
	return once, executed
}

// checkAnswers checks that every answer is the handler's 201 (executed or
// replayed) or a 409 with Retry-After: the store never failed. The one
// failure a loaded machine may cause is a timeout: the servers' store
// clients give Redis 250 ms (redisstore.ClientOptions, rueidisstore's
// ClientOption), which a machine that stalls Redis or a server that long
// exceeds. A 503 with Retry-After is taken for one when the servers
// logged a timeout for each, and no store error of another kind.
func checkAnswers(t testing.TB, srvs []*server, replies []*reply, lease time.Duration) {
	t.Helper()
	bad := failures{t: t}
	var n503 int
	for _, r := range replies {
		switch {
		case r.err != nil:
			bad.add("%v", r)
		case r.status == http.StatusCreated:
		case r.status == http.StatusConflict:
			if err := checkRetryAfter(r, lease); err != nil {
				bad.add("%v", err)
			}
		case r.status == http.StatusServiceUnavailable:
			n503++
			if err := checkRetryAfter(r, lease); err != nil {
				bad.add("%v", err)
			}
		default:
			bad.add("unexpected answer %v", r)
		}
	}
	if n503 > 0 {
		timeouts, others := storeErrors(srvs)
		if len(others) > 0 || len(timeouts) < n503 {
			bad.add("%d answers 503: the store failed; the servers logged %d store timeouts and %d other store errors %q",
				n503, len(timeouts), len(others), others)
		} else {
			t.Logf("%d answers 503, each after a store timeout the servers logged (a loaded machine): %q", n503, timeouts[:min(3, len(timeouts))])
		}
	}
	bad.report("answers")
}

// storeErrors returns the store errors the servers logged (idemserver's
// observer: "store-error after 250ms: ..."): the timeouts, and the others.
func storeErrors(srvs []*server) (timeouts, others []string) {
	for _, s := range srvs {
		for line := range strings.Lines(s.output()) {
			if !strings.Contains(line, " store-error after ") {
				continue
			}
			line = strings.TrimSpace(line)
			if strings.Contains(line, "i/o timeout") || strings.Contains(line, "context deadline exceeded") {
				timeouts = append(timeouts, line)
			} else {
				others = append(others, line)
			}
		}
	}
	return timeouts, others
}
