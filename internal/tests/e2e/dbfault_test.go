//go:build unix

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/mysqltest"
	"github.com/idemkit/idem/internal/pgtest"
)

// The fault tests of the database modes (idemserver -pg and -mysql),
// written once for both: a process stopped past its leases before its
// fences, and the database crashed under load.

// orderDB is a database mode's tables, as the tests read them: pgEnv
// (-pg) and myEnv (-mysql).
type orderDB interface {
	// flags are the idemserver flags of the database, then more.
	flags(more ...string) []string
	// executions returns the order rows of keys, as executions.
	executions(t testing.TB, ctx context.Context, keys []string) map[string][]execution
	// states counts the store's entries by state.
	states(t testing.TB, ctx context.Context) map[string]int
	// leasesLeft counts the entries in flight whose lease has not expired
	// by the database's clock.
	leasesLeft(t testing.TB, ctx context.Context) int
}

// Both database modes can run the tests; pg_test.go's could, too.
var (
	_ orderDB = (*pgEnv)(nil)
	_ orderDB = (*myEnv)(nil)
	_ crasher = (*pgtest.Proc)(nil)
	_ crasher = (*mysqltest.Proc)(nil)
)

// crasher is a database server that a test crashes and restarts on the
// same port and data: pgtest.Proc, mysqltest.Proc.
type crasher interface {
	Crash()
	Restart()
}

// faultConfig shapes a fault test of a database mode.
type faultConfig struct {
	name    string // of the database, in messages: "PostgreSQL", "MariaDB"
	prefix  string // of the keys
	lease   time.Duration
	keys    int    // testStaleCommitRefused's
	workers int    // testRestartFailsClosed's requests in flight
	crash   string // testRestartFailsClosed: how the database crashes, in its figure
}

// testStaleCommitRefused: a process is stopped (SIGSTOP) in its handlers'
// transactions, after their orders were inserted and before the fence,
// for longer than the lease; the other processes take the keys and commit
// their orders. When the stopped process goes on, every fence finds its
// lease lost and the late transaction rolls back: one order per key, the
// one whose response every retry, on each process, gets; every entry
// ends done.
func testStaleCommitRefused(t *testing.T, env orderDB, cfg faultConfig) {
	lease, keys := cfg.lease, cfg.keys
	ctx := deadline(t, 2*time.Minute)
	base := slices.Clip(env.flags("-lease", lease.String()))
	// The stopped process's handlers each hold a connection in their
	// transactions (-pg-conns bounds -mysql's pool too).
	srvs := startEach(t, append(base, "-pg-conns", strconv.Itoa(keys+8)), base, base)
	victim := srvs[0]
	c := newClient(t)
	names := keyNames(cfg.prefix, keys)

	victim.control(t, "POST", "/gate/close")
	held := make(chan *reply, keys)
	for _, key := range names {
		go func() { held <- c.post(ctx, srvs, 0, key, key+"/stale", false) }()
	}
	waitFor(t, ctx, fmt.Sprintf("%d handlers to wait at the gate, in their transactions", keys), func() bool {
		select {
		case r := <-held:
			t.Fatalf("a request to the process at the gate was answered: %v\n%s", r, victim.output())
		default:
		}
		return victim.held(t) == keys
	})
	victim.signal(t, syscall.SIGSTOP)
	stopped := time.Now()
	resumed := false
	defer func() {
		if !resumed {
			victim.signal(t, syscall.SIGCONT)
		}
	}()
	// Each handler's order is inserted, not committed: the test's reads
	// do not see it.
	if n := countRows(env.executions(t, ctx, names)); n != 0 {
		t.Fatalf("%d orders visible before the fence, want 0", n)
	}
	waitFor(t, ctx, "the stopped process's leases to expire by the database's clock", func() bool {
		return env.leasesLeft(t, ctx) == 0
	})
	expired := time.Since(stopped)

	// The other processes take every key and commit its order.
	took := make(map[string]*reply, keys)
	for _, key := range names {
		for attempt := 0; ; attempt++ {
			r := c.post(ctx, srvs, 1+attempt%2, key, fmt.Sprintf("%s/take/%d", key, attempt), false)
			if r.err != nil || r.status != http.StatusConflict {
				took[key] = r
				break
			}
			if !sleep(ctx, 20*time.Millisecond) {
				t.Fatalf("%s: still 409 after the lease: %v", key, r)
			}
		}
	}
	victim.signal(t, syscall.SIGCONT)
	resumed = true
	victim.control(t, "POST", "/gate/open")
	late := make(map[string]*reply, keys)
	for range keys {
		select {
		case r := <-held:
			late[r.key] = r
		case <-ctx.Done():
			t.Fatalf("%d of the stopped process's %d requests answered: %v\n%s", len(late), keys, ctx.Err(), victim.output())
		}
	}
	resumedFor := time.Since(stopped)

	execs := env.executions(t, ctx, names)
	bad := failures{t: t}
	var refused int
	for _, key := range names {
		tk, lt, ex := took[key], late[key], execs[key]
		switch {
		case tk.err != nil || tk.status != http.StatusCreated || tk.replayed:
			bad.add("%s: taken over: %v, want 201 executed", key, tk)
		case len(ex) != 1:
			bad.add("%s: %d orders, want 1: %v", key, len(ex), ex)
		case ex[0].id() != tk.exec:
			bad.add("%s: the order %v is not the one of the execution that took the key over, %v", key, ex[0], tk)
		}
		if lt.err == nil && lt.status == http.StatusConflict && lt.exec != "" && lt.exec != tk.exec {
			refused++ // the stale handler's own 409: its fence found the lease lost
		} else {
			bad.add("%s: the stopped process's execution answered %v, want its 409 (lease lost)", key, lt)
		}
		// A retry now replays the execution that committed, on each process.
		for srv := range srvs {
			if r := c.post(ctx, srvs, srv, key, fmt.Sprintf("%s/after/%d", key, srv), false); !r.replayed || !r.sameResponse(tk) {
				bad.add("%s: retry on process %d after the stale execution: %v, want a replay of %v", key, srv, r, tk)
			}
		}
	}
	bad.report("stale commits")
	if st := env.states(t, ctx); st["done"] != keys || len(st) != 1 {
		t.Errorf("entries by state %v, want %d done", st, keys)
	}
	figure(t, "lease %v, %d keys whose handlers were stopped (SIGSTOP) in their %s transactions before the fence: "+
		"leases expired %v after the stop, other processes committed every key, the stopped process resumed %v after the stop; "+
		"%d late fences refused, %d orders for %d keys",
		lease, keys, cfg.name, ms(expired), ms(resumedFor), refused, countRows(execs), keys)
}

// testRestartFailsClosed: under load on three processes (-rebuild), db
// crashes (every connection breaks) and is restarted on the same port
// after at least 1.5 s and 100 answers. While it is down, every request
// gets 503 with Retry-After and no order is committed; the processes
// recover without a restart; no key gets a second order; every duplicate
// ends with its execution's response, replayed byte for byte (or, for an
// execution whose COMMIT was made durable as the server died but never
// acknowledged, the response rebuilt from its order); and every key asked
// again after the restart is replayed. db must keep the commits it
// acknowledged across the crash. The outage, with the restart, is meant
// to stay shorter than two thirds of cfg.lease, the least a lease has
// left between two renewals, so an execution that finished while the
// database was down gets its record stored by the middleware's retries
// once it is back.
func testRestartFailsClosed(t *testing.T, db crasher, env orderDB, cfg faultConfig) {
	const (
		minOutage  = 1500 * time.Millisecond
		minAnswers = 100 // to see during the outage before it ends
		progress   = 200 // keys done before and after it
	)
	lease := cfg.lease
	ctx := deadline(t, 3*time.Minute)
	srvs := startServers(t, 3, env.flags("-lease", lease.String(), "-delay", "2ms", "-rebuild")...)
	c := newClient(t)
	l := newLoad(c, srvs, loadConfig{prefix: cfg.prefix, dups: 5, workers: cfg.workers,
		backoff: 100 * time.Millisecond, maxAttempts: 2000})
	l.start(t, ctx, 1_000_000)
	begin := time.Now()
	advance := func(what string) {
		t.Helper()
		mark := l.finished.Load()
		waitFor(t, ctx, fmt.Sprintf("%d keys done %s", progress, what), func() bool { return l.finished.Load() >= mark+progress })
	}

	advance("before the crash")
	down := outage{name: "down"}
	// A request in flight from here on may have its COMMIT made durable
	// by the crash without its answer; down.start, once Crash has
	// returned, is when the database is surely gone. (With only
	// down.start, a request answered 503 while Crash was still returning
	// was taken for a refusal whose order committed: seen once in CI on
	// PostgreSQL.)
	crashed := time.Now()
	db.Crash()
	down.start = time.Now()
	mark := l.answered.Load()
	waitFor(t, ctx, "answers while "+cfg.name+" is down", func() bool {
		return l.answered.Load() >= mark+minAnswers && time.Since(down.start) >= minOutage
	})
	down.end = time.Now()
	db.Restart()
	down.back = time.Now()
	advance("after the restart")
	l.stopFeeding()
	l.wait(t, ctx)
	elapsed := time.Since(begin)

	replies := l.snapshot()
	execs := env.executions(t, ctx, l.keys)
	rids := map[string]bool{} // of requests whose order committed
	for _, ex := range execs {
		for _, e := range ex {
			rids[e.rid] = true
		}
	}

	// Every answer is 201, or a 409 or 503 with Retry-After. A refusal
	// committed nothing, but for a request under way at the crash whose
	// COMMIT became durable without its answer: its handler saw an error
	// and answered 503.
	bad := failures{t: t}
	var ambiguous []string
	for _, r := range replies {
		switch {
		case r.err != nil:
			bad.add("%v", r)
		case r.status == http.StatusCreated:
		case r.status == http.StatusConflict || r.status == http.StatusServiceUnavailable:
			if err := checkRetryAfter(r, lease); err != nil {
				bad.add("%v", err)
			}
			switch {
			case !rids[r.rid]:
			case r.status == http.StatusServiceUnavailable && r.sent.Before(down.start) && !r.recv.Before(crashed):
				ambiguous = append(ambiguous, r.key)
			default:
				bad.add("refused, but its order committed: %v", r)
			}
		default:
			bad.add("unexpected answer %v", r)
		}
	}
	bad.report("answers")

	// Fail closed: what was sent and answered while the database was down
	// is a 503, never an order.
	oc := down.check(t, replies, cfg.name+" was down")

	// The checks below hold for an outage shorter than the lease's last
	// two thirds; it lasts until the clients got enough answers, and the
	// database restarted, which a loaded machine may stretch. Past
	// outageMargin (from the crash until the database answered again,
	// and the processes reached it again: see outage.lasted) a lease may
	// rightly have run out: the test then has no verdict on them when
	// they fail.
	outageFor := down.back.Sub(crashed) + max(oc.firstOK, oc.last503, 0)
	tooLong := outageFor >= outageMargin(lease)
	noVerdict := ""

	// One order per key; every duplicate's final answer is the response
	// of that order's execution: its own answer, or a replay of it byte
	// for byte.
	once := failures{t: t}
	answer := map[string]*reply{} // per key, the answer that made or replayed its order's response
	var executed int
	for _, key := range l.keys {
		ex := execs[key]
		executed += len(ex)
		if len(ex) != 1 {
			once.add("%s: %d orders, want 1: %v", key, len(ex), ex)
			continue
		}
		finals := l.finals[key]
		if len(finals) != l.cfg.dups {
			once.add("%s: %d final answers, want %d", key, len(finals), l.cfg.dups)
			continue
		}
		var orig *reply // the executed answer, when one reached its client
		for _, r := range finals {
			switch {
			case r.status != http.StatusCreated:
				once.add("%s: final answer %v", key, r)
			case r.exec != ex[0].id():
				once.add("%s: answer %v is not from the order's execution %v", key, r, ex[0])
			case r.replayed:
			case r.rid != ex[0].rid || orig != nil:
				once.add("%s: answer %v executed, but the order is of %v", key, r, ex[0])
			default:
				orig = r
			}
		}
		ref := orig
		if ref == nil {
			ref = finals[0] // rebuilt: the execution's answer never reached its client
		}
		for _, r := range finals {
			if !r.sameResponse(ref) {
				once.add("%s: answer %v differs from %v", key, r, ref)
			}
		}
		answer[key] = ref
	}
	if once.n > 0 && tooLong {
		noVerdict = fmt.Sprintf("%d violations of one order per key (the first: %s)", once.n, once.msgs[0])
	} else {
		once.report("orders")
	}

	// The records survived the restart: every key, asked once more,
	// replays its answer and commits nothing.
	checkAskedAgain(t, ctx, c, srvs, l.keys, answer, execs, func() map[string][]execution { return env.executions(t, ctx, l.keys) })
	states := env.states(t, ctx)
	if states["processing"] != 0 || states["done"]+states["committed"] != len(l.keys) || states["committed"] > len(ambiguous) {
		if tooLong {
			noVerdict += fmt.Sprintf("; entries by state %v for %d keys (%d commits not acknowledged)", states, len(l.keys), len(ambiguous))
		} else {
			t.Errorf("entries by state %v for %d keys (%d commits not acknowledged), want every key done", states, len(l.keys), len(ambiguous))
		}
	}

	figure(t, "lease %v, 3 processes on %s, %d keys x %d duplicates, %d in flight, in %v: %d requests, %d answered 409, %d answered 503; "+
		"%s down (%s; the restart took %v) for %v: %d requests sent and answered meanwhile, %d of them 503 with Retry-After; "+
		"after the restart: first success %v, last 503 %v; %d orders for %d keys (%d committed as the server died, answered 503, "+
		"then rebuilt); %d keys asked again",
		lease, cfg.name, len(l.keys), l.cfg.dups, l.cfg.workers, ms(elapsed), len(replies), l.n409.Load(), l.n503.Load(),
		cfg.name, cfg.crash, ms(down.back.Sub(down.end)), ms(down.end.Sub(down.start)), oc.n, oc.refused, ms(oc.firstOK), ms(oc.last503), executed,
		len(l.keys), len(ambiguous), len(l.keys))
	if noVerdict != "" {
		t.Skipf("%s; but %s was away for up to %v, more than %v of a %v lease (a loaded machine): a lease may have run out, no verdict",
			strings.TrimPrefix(noVerdict, "; "), cfg.name, ms(outageFor), outageMargin(lease), lease)
	}
}
