//go:build unix

package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/redistest"
)

// The tests of this file deploy a process under load: SIGTERM while its
// handlers finish and the store cannot take their records, because the
// store's Redis is down. idemserver then shuts down in the order
// Middleware.Shutdown documents: http.Server.Shutdown (stop accepting,
// wait for the handlers), Middleware.Shutdown (wait for their records,
// which the middleware retries in the background since the store refused
// them), close the Redis clients, exit 0. Every key is then sent again to
// another process, which must replay every response the stopped process
// gave and run no key twice.
//
// Redis is killed (and restarted on its append-only file), not stopped
// with SIGSTOP: a stopped Redis on loopback still receives what clients
// send, and executes it when it continues, even from a process that has
// exited since. The command of the first, failed, attempt to store a
// record would then store it anyway, and a shutdown that does not wait
// would pass the test (it did, when the test was written so).

// Shape of the deploy.
const (
	shutdownLease = 6 * time.Second
	// shutdownOutage is how long the store's Redis stays down after
	// SIGTERM; the whole outage stays well under two thirds of the lease.
	shutdownOutage  = time.Second
	shutdownKeys    = 800 // at most; the load stops at SIGTERM
	shutdownWorkers = 64
	shutdownDelay   = 100 * time.Millisecond // the handler's work
	// shutdownBefore is how many executions A answers before the outage,
	// and shutdownFailed how many of its records the store must have
	// refused before SIGTERM.
	shutdownBefore = 150
	shutdownFailed = 10
)

// TestShutdownStoresRecords: under load, the store's Redis goes down, so
// that the records of the handlers that finish on process A are refused
// and retried in the background; then A gets SIGTERM. Redis is back a
// second later (restarted on its append-only file); A exits by itself,
// with status 0, once every record is stored. Every key sent to A is then
// sent again to process B: each key A executed is replayed byte for byte
// with A's response, at once (never 409), and no key runs twice; the keys
// A refused (503) or never got run once, on B.
func TestShutdownStoresRecords(t *testing.T) {
	d := runDeploy(t, false)
	failed := d.exitErr != nil || !strings.Contains(d.out, "shutdown: records stored") || d.bad.n > 0 ||
		d.lostAfter != 0 || d.storedLate < d.lostAtTerm
	// Every record is stored if the store is back before the leases of
	// the records refused run out: the outage, a second after SIGTERM,
	// once enough records were refused, and the restart, stays well
	// within two thirds of the lease, unless a loaded machine stretches
	// it past outageMargin. The test then has no verdict.
	if outage := d.back.Sub(d.down); failed && outage >= outageMargin(shutdownLease) {
		t.Skipf("records lost or keys run twice (%d violations; %d records never stored; A exited with %v); "+
			"but Redis was away for %v, more than %v of a %v lease (a loaded machine): a lease may have run out, no verdict; A's shutdown:\n%s",
			d.bad.n, d.lostAfter, d.exitErr, ms(outage), outageMargin(shutdownLease), shutdownLease, d.shutdownLines())
	}
	if d.exitErr != nil || !strings.Contains(d.out, "shutdown: records stored") {
		t.Errorf("A exited with %v, want status 0 after \"shutdown: records stored\"; its shutdown:\n%s", d.exitErr, d.shutdownLines())
	}
	d.bad.report("after the deploy")
	if d.lostAfter != 0 {
		t.Errorf("%d records refused by the store were never stored: owners %v", d.lostAfter, d.lostOwners)
	}
	if d.storedLate < d.lostAtTerm {
		t.Errorf("%d records refused before SIGTERM, %d stored by a retry", d.lostAtTerm, d.storedLate)
	}
	figure(t, "lease %v, %d keys to A (%d in flight, handler %v): %d executed on A, %d answered 503, %d transport errors "+
		"(A stopped accepting); Redis down %v, SIGTERM %v into it with %d records refused; "+
		"A's handlers returned, A exited 0 %v after SIGTERM (%v after Redis was back), %d records stored by its retries, %d never; "+
		"all %d keys sent again to B in %v: %d replayed A's response byte for byte (%d got 409 first), "+
		"%d executed on B (%d after a 409, until the lease of an Acquire the store took but did not answer), %d ran twice",
		shutdownLease, d.keys, shutdownWorkers, shutdownDelay, d.onA, d.n503, d.nErr,
		ms(d.back.Sub(d.down)), ms(d.term.Sub(d.down)), d.lostAtTerm,
		ms(d.exited.Sub(d.term)), ms(d.exited.Sub(d.back)), d.storedLate, d.lostAfter,
		d.keys, ms(d.retried), d.replayed, d.conflictsOnA, d.onB, d.conflictsOther, d.twice)
}

// TestShutdownWithoutWaitRunsTwice tests the test above: the same deploy
// with a shutdown that does not wait for the records (-no-shutdown-wait:
// A exits right after http.Server.Shutdown) loses the records the store
// refused, and the retries on B run those keys a second time once their
// leases have expired; the checks of TestShutdownStoresRecords report
// them. Every key that ran twice is one whose record A lost.
func TestShutdownWithoutWaitRunsTwice(t *testing.T) {
	d := runDeploy(t, true)
	if d.exitErr != nil {
		t.Errorf("A exited with %v, want status 0; its shutdown:\n%s", d.exitErr, d.shutdownLines())
	}
	lost := map[string]bool{}
	for _, o := range d.lostOwners {
		lost[o] = true
	}
	for _, o := range d.twiceOwners {
		if !lost[o] {
			t.Errorf("a key ran twice though A's record of owner %s was not refused", o)
		}
	}
	if d.twice == 0 || d.bad.n == 0 {
		t.Errorf("without the shutdown's wait %d keys ran twice, %d violations (%d records refused before SIGTERM, %d never stored): the deploy test has no power",
			d.twice, d.bad.n, d.lostAtTerm, d.lostAfter)
	} else {
		t.Logf("without the wait, the deploy test reports %d violations; the first:\n\t%s", d.bad.n, strings.Join(d.bad.msgs, "\n\t"))
	}
	figure(t, "without the shutdown's wait: %d keys to A, %d executed on A, %d records refused before SIGTERM; "+
		"A exited %v after SIGTERM (%v before Redis was back), %d records never stored; "+
		"on B %d keys replayed, %d got 409 until their lease expired, then %d ran a second time (%d violations)",
		d.keys, d.onA, d.lostAtTerm, ms(d.exited.Sub(d.term)), ms(d.back.Sub(d.exited)), d.lostAfter,
		d.replayed, d.conflictsOnA, d.twice, d.bad.n)
}

// deploy is what happened in one run of runDeploy.
type deploy struct {
	keys                     int
	out                      string // A's output
	exitErr                  error  // A's exit: nil for status 0
	down, term, back, exited time.Time

	lostAtTerm int      // records refused and not stored at SIGTERM
	lostAfter  int      // after A exited
	lostOwners []string // their owners
	storedLate int      // records A stored after a refusal

	onA, n503, nErr int // A's executions, 503s, transport errors
	// On B: A's responses replayed, keys A executed that got 409 first,
	// executions, keys A did not execute that got 409 first.
	replayed, conflictsOnA, onB, conflictsOther int
	retried                                     time.Duration // sending every key to B
	twice                                       int           // keys that ran more than once
	twiceOwners                                 []string      // of their execution on A

	bad failures
}

// shutdownLines returns the lines of A's output about its shutdown.
func (d *deploy) shutdownLines() string {
	var b strings.Builder
	for line := range strings.Lines(d.out) {
		if strings.HasPrefix(line, "shutdown:") {
			b.WriteString("\t" + line)
		}
	}
	return b.String()
}

// runDeploy runs the deploy, with a shutdown that does not wait for the
// records when noWait, and checks what the clients got; the caller
// reports the violations.
func runDeploy(t *testing.T, noWait bool) *deploy {
	// The records survive the restart in the append-only file.
	store := redistest.StartProc(t, "--appendonly", "yes", "--appendfsync", "always", "--dir", t.TempDir())
	countAddr := redistest.Start(t)
	ctx := deadline(t, time.Minute)
	flags := []string{"-redis", store.Addr(), "-count-redis", countAddr, "-lease", shutdownLease.String(),
		"-ttl", "10m", "-delay", shutdownDelay.String(), "-shutdown-timeout", "20s"}
	flagsA := flags
	if noWait {
		flagsA = append(flagsA[:len(flagsA):len(flagsA)], "-no-shutdown-wait")
	}
	a, b := startServers(t, 1, flagsA...)[0], startServers(t, 1, flags...)[0]
	srvs := []*server{a, b}
	counts := redisClient(t, countAddr)
	c := newClient(t)
	d := &deploy{bad: failures{t: t}}

	// Load on A alone: each key once, never retried.
	l := newLoad(c, srvs[:1], loadConfig{prefix: "deploy-", dups: 1, workers: shutdownWorkers,
		backoff: time.Millisecond, maxAttempts: 1})
	l.start(t, ctx, shutdownKeys)
	waitFor(t, ctx, fmt.Sprintf("%d executions on A", shutdownBefore), func() bool { return l.nExecuted.Load() >= shutdownBefore })

	// The store goes down while at least shutdownFailed handlers are
	// running (A's gate holds them, so that a slow machine cannot make the
	// outage miss them): they finish, answer their clients, and their
	// records are refused (the store reports each in "lost"); new requests
	// get 503.
	a.control(t, "POST", "/gate/close")
	waitFor(t, ctx, fmt.Sprintf("%d handlers held at A's gate", shutdownFailed), func() bool {
		return a.held(t) >= shutdownFailed
	})
	store.Kill()
	d.down = time.Now()
	a.control(t, "POST", "/gate/open")
	waitFor(t, ctx, fmt.Sprintf("%d records refused by the store", shutdownFailed), func() bool {
		return counts.SCard(ctx, "lost").Val() >= shutdownFailed
	})
	d.lostAtTerm = int(counts.SCard(ctx, "lost").Val())

	// Deploy: SIGTERM to A during the outage; send no new key.
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	d.term = time.Now()
	l.stopFeeding()
	exit := a.watchExit(t)
	sleep(ctx, shutdownOutage) // the outage itself
	store.Restart()
	d.back = time.Now()
	// A exits by itself once its records are stored.
	select {
	case <-exit.done:
	case <-time.After(20 * time.Second):
		a.cmd.Process.Kill()
		<-exit.done
		t.Fatalf("A did not exit within 20s of the store's restart; killed it:\n%s", a.output())
	}
	d.exited, d.exitErr, d.out = exit.at, exit.err, a.output()
	t.Logf("A's shutdown:\n%s", d.shutdownLines())
	l.wait(t, ctx)
	d.storedLate = strings.Count(d.out, "stored after a retry owner=")
	d.lostOwners = counts.SMembers(ctx, "lost").Val()
	d.lostAfter = len(d.lostOwners)

	// Every key again, on B, until an answer other than 409 or 503: a key
	// whose record A lost is in flight until its lease expires. All keys
	// once, then those refused again, in rounds.
	rctx, cancel := context.WithTimeout(ctx, shutdownLease+15*time.Second)
	defer cancel()
	again := make([][]*reply, len(l.keys))
	pending := make([]int, len(l.keys))
	for i := range pending {
		pending[i] = i
	}
	begin := time.Now()
	for round := 0; len(pending) > 0; round++ {
		if round > 0 && !sleep(rctx, 100*time.Millisecond) {
			t.Fatalf("%d keys still refused by B %v after A exited", len(pending), time.Since(d.exited).Round(time.Second))
		}
		next := make(chan int)
		var wg sync.WaitGroup
		for range min(32, len(pending)) {
			wg.Go(func() {
				for i := range next {
					key := l.keys[i]
					again[i] = append(again[i], c.post(rctx, srvs, 1, key, fmt.Sprintf("%s/again/%d", key, round), false))
				}
			})
		}
		for _, i := range pending {
			next <- i
		}
		close(next)
		wg.Wait()
		pending = slices.DeleteFunc(pending, func(i int) bool {
			r := again[i][len(again[i])-1]
			return r.err != nil || r.status != http.StatusConflict && r.status != http.StatusServiceUnavailable
		})
	}
	d.retried = time.Since(begin)
	execs := executions(t, ctx, counts, l.keys)
	d.check(l, execs, again, a.pid, b.pid)
	return d
}

// check checks every key: the answer A gave, its executions, and the
// answers B gave.
func (d *deploy) check(l *load, execs map[string][]execution, again [][]*reply, pidA, pidB int) {
	bad := &d.bad
	d.keys = len(l.keys)
	for i, key := range l.keys {
		ex := execs[key]
		var onA *execution
		for j := range ex {
			if ex[j].pid == pidA {
				onA = &ex[j]
			} else if ex[j].pid != pidB {
				bad.add("%s: execution %v by neither A nor B", key, ex[j])
			}
		}
		if len(ex) > 1 {
			d.twice++
			bad.add("%s executed %d times: %v", key, len(ex), ex)
			if onA != nil {
				d.twiceOwners = append(d.twiceOwners, onA.owner)
			}
		}
		if onA != nil {
			d.onA++
		}
		// A's answer.
		var a *reply
		if f := l.finals[key]; len(f) == 1 {
			a = f[0]
		} else {
			bad.add("%s: %d answers from A, want 1: %v", key, len(f), f)
		}
		switch {
		case a == nil:
		case a.err != nil:
			d.nErr++
		case a.status == http.StatusCreated:
			if a.replayed || onA == nil || a.exec != onA.id() || a.rid != onA.rid {
				bad.add("%s: A answered %v, not from its execution %v", key, a, onA)
			}
		case a.status == http.StatusServiceUnavailable:
			d.n503++
			if err := checkRetryAfter(a, shutdownLease); err != nil {
				bad.add("%v", err)
			}
			if onA != nil && onA.rid == a.rid {
				bad.add("%s: A answered 503 but ran the handler: %v", key, a)
			}
		default:
			bad.add("%s: unexpected answer from A %v", key, a)
		}
		// B's answers.
		rs := again[i]
		final := rs[len(rs)-1]
		conflict := false
		for _, r := range rs[:len(rs)-1] {
			if r.status == http.StatusConflict {
				conflict = true
				if err := checkRetryAfter(r, shutdownLease); err != nil {
					bad.add("%v", err)
				}
			}
		}
		switch {
		case final.err != nil || final.status != http.StatusCreated:
			bad.add("%s: B's final answer %v", key, final)
		case onA != nil:
			if conflict {
				d.conflictsOnA++
				bad.add("%s: executed on A (%v), in flight on B after A exited: its record was not stored", key, onA)
			}
			switch {
			case !final.replayed:
				bad.add("%s: executed on A (%v), executed again on B: %v", key, onA, final)
			case final.exec != onA.id():
				bad.add("%s: B replayed %v, not A's execution %v", key, final, onA)
			case a != nil && a.status == http.StatusCreated && !final.sameResponse(a):
				bad.add("%s: B replayed %v, A answered %v", key, final, a)
			default:
				d.replayed++
			}
		case final.replayed:
			bad.add("%s: B replayed %v, but no execution ran on A", key, final)
		default:
			d.onB++
			if conflict {
				// A's Acquire was taken by the store, then the store died
				// before answering: A answered 503, and the lease held the
				// key until it expired.
				d.conflictsOther++
			}
			if len(ex) == 0 || ex[len(ex)-1].id() != final.exec || ex[len(ex)-1].rid != final.rid {
				bad.add("%s: B answered %v, not from its execution: %v", key, final, ex)
			}
		}
	}
}

// exitWatch is the exit of a process that a test waits for.
type exitWatch struct {
	done chan struct{} // closed once the process has exited
	at   time.Time     // then
	err  error         // its exit error: nil for status 0
}

// watchExit waits for the process in the background. From then on the
// server's kill does nothing; the process is killed, and waited for, when
// the test ends.
func (s *server) watchExit(t testing.TB) *exitWatch {
	t.Helper()
	w := &exitWatch{done: make(chan struct{})}
	started := false
	s.once.Do(func() {
		started = true
		go func() {
			err := s.cmd.Wait()
			w.at, w.err = time.Now(), err
			close(w.done)
		}()
	})
	if !started {
		t.Fatal("watchExit: the process was killed")
	}
	t.Cleanup(func() {
		s.cmd.Process.Kill() // an error once it has exited
		<-w.done
	})
	return w
}

// control sends a request to one of the server's test endpoints (its gate)
// and returns the answer's body.
func (s *server) control(t testing.TB, method, path string) string {
	t.Helper()
	req, err := http.NewRequest(method, strings.TrimSuffix(s.url, "/orders")+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("%s %s: %d %s", method, path, res.StatusCode, b)
	}
	return string(b)
}

// held returns the number of handlers waiting at the server's gate.
func (s *server) held(t testing.TB) int {
	t.Helper()
	n, err := strconv.Atoi(s.control(t, "GET", "/gate/held"))
	if err != nil {
		t.Fatal(err)
	}
	return n
}
