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

// outage is a time when the store's Redis could not answer.
type outage struct {
	name       string
	start, end time.Time // Redis stopped or killed; resumed or restarted
	back       time.Time // Redis answering again
	next       time.Time // the next outage's start, if any
}

// inside reports whether r was sent and answered during the outage.
func (o outage) inside(r *reply) bool { return !r.sent.Before(o.start) && r.recv.Before(o.end) }

// outcome is what the clients saw of an outage.
type outcome struct {
	n, refused int             // requests sent and answered during it; of them, 503s
	wait       []time.Duration // to each 503 sent during it
	// From the store answering again (back): to the first request sent
	// afterwards that succeeded, and to the last that got a 503 (until the
	// next outage).
	firstOK, last503 time.Duration
}

// check checks that the store failed closed during o (what says how:
// "Redis was stopped"): every request sent and answered meanwhile got a
// 503, never an execution; that enough were, for the outage to be
// exercised; and that a request sent afterwards succeeded. It returns
// what the clients saw.
func (o outage) check(t testing.TB, replies []*reply, what string) outcome {
	t.Helper()
	closed := failures{t: t}
	oc := outcome{firstOK: -1}
	for _, r := range replies {
		if o.inside(r) {
			oc.n++
			if r.status == http.StatusServiceUnavailable {
				oc.refused++
			} else {
				closed.add("answered while %s: %v", what, r)
			}
		}
		if r.status == http.StatusServiceUnavailable && !r.sent.Before(o.start) && r.sent.Before(o.end) {
			oc.wait = append(oc.wait, r.recv.Sub(r.sent))
		}
		if r.sent.Before(o.back) || !o.next.IsZero() && !r.sent.Before(o.next) {
			continue
		}
		if d := r.recv.Sub(o.back); r.status == http.StatusCreated && (oc.firstOK < 0 || d < oc.firstOK) {
			oc.firstOK = d
		}
		if d := r.recv.Sub(o.back); r.status == http.StatusServiceUnavailable && d > oc.last503 {
			oc.last503 = d
		}
	}
	closed.report("while " + what)
	if oc.n < 10 {
		t.Errorf("only %d requests sent and answered while %s: the outage was not exercised", oc.n, what)
	}
	if oc.firstOK < 0 {
		t.Errorf("no request succeeded after %s", what)
	}
	return oc
}

// lasted returns how long the outage lasted for the processes, at most:
// from its start until the store answered again, and then until the
// processes reached it again (the first success after it, or the last
// 503, whichever came later).
func (o outage) lasted(oc outcome) time.Duration {
	return o.back.Sub(o.start) + max(oc.firstOK, oc.last503, 0)
}

// TestRedisOutageFailsClosed: under load on three processes, the store's
// Redis is stalled (SIGSTOP, then SIGCONT), later killed and restarted on
// the same port with its append-only file. While it cannot answer, every
// request gets 503 with Retry-After and no handler runs; the processes
// recover without a restart when it is back; no record is lost across the
// restart; and no key runs twice. Each outage is shorter than two thirds
// of the lease, the least a lease has left between two renewals, so a
// handler that finished while Redis was away gets its record stored by
// the middleware's retries once Redis is back, before its lease expires.
// It runs for each client of the store.
func TestRedisOutageFailsClosed(t *testing.T) { eachClient(t, testRedisOutageFailsClosed) }

func testRedisOutageFailsClosed(t *testing.T, client string) {
	const (
		lease      = 6 * time.Second
		ttl        = 10 * time.Minute
		minOutage  = 1500 * time.Millisecond
		minAnswers = 100 // to see in each outage before it ends
		progress   = 200 // keys done between two phases
	)
	store := redistest.StartProc(t, "--appendonly", "yes", "--appendfsync", "always", "--dir", t.TempDir())
	countAddr := redistest.Start(t)
	ctx := deadline(t, 3*time.Minute)
	srvs := startServers(t, 3, "-client", client, "-redis", store.Addr(), "-count-redis", countAddr,
		"-lease", lease.String(), "-ttl", ttl.String(), "-delay", "2ms")
	counts := redisClient(t, countAddr)
	c := newClient(t)
	l := newLoad(c, srvs, loadConfig{prefix: "outage-", dups: 5, workers: 48,
		backoff: 100 * time.Millisecond, maxAttempts: 2000})
	l.start(t, ctx, 1_000_000)
	begin := time.Now()

	advance := func(what string) {
		t.Helper()
		mark := l.finished.Load()
		waitFor(t, ctx, fmt.Sprintf("%d keys done %s", progress, what), func() bool { return l.finished.Load() >= mark+progress })
	}
	// An outage lasts minOutage and until the clients got minAnswers
	// answers (503s, if it holds).
	refuse := func(o *outage) {
		t.Helper()
		mark := l.answered.Load()
		waitFor(t, ctx, "answers while Redis is "+o.name, func() bool {
			return l.answered.Load() >= mark+minAnswers && time.Since(o.start) >= minOutage
		})
		o.end = time.Now()
	}

	advance("before the outages")
	stall := outage{name: "stopped (SIGSTOP)"}
	store.Pause()
	stall.start = time.Now()
	refuse(&stall)
	store.Resume()
	stall.back = time.Now()
	advance("after SIGCONT")

	down := outage{name: "killed"}
	store.Kill()
	down.start = time.Now()
	refuse(&down)
	store.Restart()
	down.back = time.Now()
	advance("after the restart")
	l.stopFeeding()
	l.wait(t, ctx)
	elapsed := time.Since(begin)

	replies := l.snapshot()
	execs := executions(t, ctx, counts, l.keys)
	// Completions that failed during an outage and were not stored by a
	// later retry (checked below).
	lost := counts.SMembers(ctx, "lost").Val()
	rids := map[string]bool{} // of requests that ran the handler
	for _, ex := range execs {
		for _, e := range ex {
			rids[e.rid] = true
		}
	}

	// Every answer is 201, or a 409 or 503 with Retry-After, and a
	// refusal never ran the handler.
	bad := failures{t: t}
	for _, r := range replies {
		switch {
		case r.err != nil:
			bad.add("%v", r)
		case r.status == http.StatusCreated:
		case r.status == http.StatusConflict || r.status == http.StatusServiceUnavailable:
			if err := checkRetryAfter(r, lease); err != nil {
				bad.add("%v", err)
			}
			if rids[r.rid] {
				bad.add("refused, but its handler ran: %v", r)
			}
		default:
			bad.add("unexpected answer %v", r)
		}
	}
	bad.report("answers")

	// Fail closed: what was sent and answered while Redis could not
	// answer is a 503, never an execution.
	stall.next = down.start
	var longest time.Duration // the longest outage, as the processes saw it at most
	for _, o := range []*outage{&stall, &down} {
		oc := o.check(t, replies, "Redis was "+o.name)
		longest = max(longest, o.lasted(oc))
		figure(t, "Redis %s for %v: %d requests sent and answered meanwhile, %d of them 503 with Retry-After; "+
			"%d 503s to requests sent meanwhile, waited p50 %v, max %v; after it was back: first success %v, last 503 %v",
			o.name, ms(o.end.Sub(o.start)), oc.n, oc.refused, len(oc.wait), ms(quantile(oc.wait, 0.5)), ms(quantile(oc.wait, 1)),
			ms(oc.firstOK), ms(oc.last503))
	}

	// No record lost and no key run twice hold for outages shorter than
	// the lease's last two thirds; each outage lasts until the clients
	// got enough answers, and Redis restarted, which a loaded machine may
	// stretch. Past outageMargin a lease may rightly have run out: the
	// test then has no verdict on them when they fail.
	tooLong := longest >= outageMargin(lease)
	noVerdict := ""
	// A Complete that failed during an outage and was not stored by a
	// later retry: there must be none.
	if len(lost) != 0 {
		if tooLong {
			noVerdict = fmt.Sprintf("%d completions were never stored", len(lost))
		} else {
			t.Errorf("%d completions were never stored: owners %v", len(lost), lost)
		}
	}

	// Every key ran once; twice only after a completion that could not be
	// stored, once its lease had expired. Every duplicate's final answer
	// is an execution's response; replays are the last one's byte for
	// byte.
	once := failures{t: t}
	lastExec := map[string]*reply{}
	var executed int
	for _, key := range l.keys {
		ex := execs[key]
		executed += len(ex)
		if len(ex) == 0 {
			once.add("%s never executed", key)
			continue
		}
		if len(ex) > 1 {
			once.add("%s executed %d times, though every outage was shorter than the lease's last two thirds: %v", key, len(ex), ex)
		}
		byExec := map[string]*reply{}
		for _, r := range l.finals[key] {
			if r.status == http.StatusCreated && !r.replayed {
				byExec[r.exec] = r
			}
		}
		last := byExec[ex[len(ex)-1].id()]
		if last == nil {
			once.add("%s: no duplicate got the answer of its last execution %v: %v", key, ex[len(ex)-1], l.finals[key])
			continue
		}
		lastExec[key] = last
		if len(l.finals[key]) != l.cfg.dups {
			once.add("%s: %d final answers, want %d", key, len(l.finals[key]), l.cfg.dups)
		}
		for _, r := range l.finals[key] {
			switch {
			case r.status != http.StatusCreated:
				once.add("%s: final answer %v", key, r)
			case !r.replayed && !slices.ContainsFunc(ex, func(e execution) bool { return e.id() == r.exec && e.rid == r.rid }):
				once.add("%s: answer %v is from no execution of %v", key, r, ex)
			case r.replayed && !r.sameResponse(last):
				once.add("%s: replay %v differs from the last execution's answer %v", key, r, last)
			}
		}
	}
	if once.n > 0 && tooLong {
		noVerdict += fmt.Sprintf("; %d violations of exactly once (the first: %s)", once.n, once.msgs[0])
	} else {
		once.report("executions")
	}

	// Records survive the restart: every key, asked once more, replays
	// its last execution and runs nothing.
	checkAskedAgain(t, ctx, c, srvs, l.keys, lastExec, execs, func() map[string][]execution { return executions(t, ctx, counts, l.keys) })
	checkTTLs(t, ctx, redisClient(t, store.Addr()), "idem:", lease, ttl)

	figure(t, "lease %v, 3 processes, %d keys x %d duplicates, %d in flight, in %v: %d requests, %d answered 409, "+
		"%d answered 503; %d executions; %d completions never stored; %d keys asked again after the restart: all replayed",
		lease, len(l.keys), l.cfg.dups, l.cfg.workers, ms(elapsed), len(replies), l.n409.Load(), l.n503.Load(),
		executed, len(lost), len(l.keys))
	if noVerdict != "" {
		t.Skipf("%s; but Redis was away for up to %v, more than %v of a %v lease (a loaded machine): a lease may have run out, no verdict",
			strings.TrimPrefix(noVerdict, "; "), ms(longest), outageMargin(lease), lease)
	}
}

// TestRedisRestartWithoutPersistenceForgets shows why the outage test
// runs Redis with an append-only file: a Redis restarted without
// persistence (or a replica) has forgotten every record, so a retry after
// the restart runs the handler again. It runs for each client of the
// store.
func TestRedisRestartWithoutPersistenceForgets(t *testing.T) {
	eachClient(t, testRedisRestartWithoutPersistenceForgets)
}

func testRedisRestartWithoutPersistenceForgets(t *testing.T, client string) {
	store := redistest.StartProc(t)
	countAddr := redistest.Start(t)
	ctx := deadline(t, time.Minute)
	srvs := startServers(t, 1, "-client", client, "-redis", store.Addr(), "-count-redis", countAddr)
	counts := redisClient(t, countAddr)
	c := newClient(t)
	const key = "forget"

	first := c.post(ctx, srvs, 0, key, "first", false)
	replay := c.post(ctx, srvs, 0, key, "replay", false)
	if first.status != http.StatusCreated || first.replayed || !replay.replayed || !replay.sameResponse(first) {
		t.Fatalf("before the restart: %v, then %v; want an execution, then its replay", first, replay)
	}
	store.Kill()
	store.Restart()
	var again *reply
	waitFor(t, ctx, "the server to reach the restarted Redis", func() bool {
		again = c.post(ctx, srvs, 0, key, fmt.Sprintf("again-%d", time.Now().UnixNano()), false)
		return again.err != nil || again.status != http.StatusServiceUnavailable
	})
	if again.status != http.StatusCreated || again.replayed {
		t.Fatalf("after a restart without persistence: %v, want a new execution", again)
	}
	if n, err := countExecutions(ctx, counts, key); n != 2 || err != nil {
		t.Fatalf("%d executions (%v), want 2", n, err)
	}
}

// checkAskedAgain checks that the records survived an outage: every key,
// asked once more, replays want[key] (when there is one) and runs nothing:
// the executions that count reads afterwards are those of before.
func checkAskedAgain(t testing.TB, ctx context.Context, c *client, srvs []*server, keys []string,
	want map[string]*reply, before map[string][]execution, count func() map[string][]execution) {
	t.Helper()
	again := askAgain(ctx, c, srvs, keys)
	after := count()
	kept := failures{t: t}
	for i, key := range keys {
		if r, w := again[i], want[key]; w != nil && (r.err != nil || !r.replayed || !r.sameResponse(w)) {
			kept.add("%s: asked again after the outage: %v, want a replay of %v", key, r, w)
		}
		if len(after[key]) != len(before[key]) {
			kept.add("%s: asked again, executed again: %v", key, after[key])
		}
	}
	kept.report("records after the outage")
}

// askAgain sends every key once more, 32 at a time, spread over the
// servers, and returns the answers in the order of keys.
func askAgain(ctx context.Context, c *client, srvs []*server, keys []string) []*reply {
	out := make([]*reply, len(keys))
	var wg sync.WaitGroup
	next := make(chan int)
	for range 32 {
		wg.Go(func() {
			for i := range next {
				out[i] = c.post(ctx, srvs, i%len(srvs), keys[i], keys[i]+"/again", false)
			}
		})
	}
	for i := range keys {
		next <- i
	}
	close(next)
	wg.Wait()
	return out
}
