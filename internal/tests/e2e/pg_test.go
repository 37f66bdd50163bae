//go:build unix

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/tests/pgxtest"
	"github.com/idemkit/idem/storage/pgstore"
	"github.com/idemkit/idem/storage/sqlstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

// pgStores are the records' stores of the PostgreSQL tests' servers
// (idemserver -pg-store): pgstore through pgx, and sqlstore's PostgreSQL
// dialect through database/sql and pgx's driver.
var pgStores = []string{"pgstore", "sqlstore"}

// onPGStores runs test on each of pgStores, as a subtest of its name.
func onPGStores(t *testing.T, test func(t *testing.T, store string)) {
	for _, store := range pgStores {
		t.Run(store, func(t *testing.T) { test(t, store) })
	}
}

// pgEnv is the database of the PostgreSQL tests' servers (idemserver -pg):
// the records' table (pgstore's or sqlstore's) and the orders table, both
// of the test's own, created before the servers start and dropped when
// the test ends.
type pgEnv struct {
	pool          *pgxpool.Pool // the test's own
	dsn           string
	store         string // of pgStores
	table, orders string // as names
	idemT, ordT   string // sanitized
	// now is the database's clock as the records' table keeps its times:
	// a timestamptz in pgstore's, microseconds since the Unix epoch (a
	// bigint) in sqlstore's.
	now string
}

// newPG creates the tables on the server of dsn, the records' table of
// store (one of pgStores).
func newPG(t testing.TB, dsn, store string) *pgEnv {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close) // after the tables are dropped
	e := &pgEnv{pool: pool, dsn: dsn, store: store, table: pgxtest.Table(t, pool), orders: pgxtest.Table(t, pool)}
	e.idemT, e.ordT = pgx.Identifier{e.table}.Sanitize(), pgx.Identifier{e.orders}.Sanitize()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	switch store {
	case "pgstore":
		e.now = "clock_timestamp()"
		st, err := pgstore.New(pool, pgstore.WithTable(e.table))
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		if err := st.CreateTable(ctx); err != nil {
			t.Fatal(err)
		}
	case "sqlstore":
		e.now = "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint"
		db := stdlib.OpenDBFromPool(pool)
		defer db.Close()
		st, err := sqlstore.New(db, sqlstore.PostgreSQL, sqlstore.WithTable(e.table))
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		if err := st.CreateTable(ctx); err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatalf("no PostgreSQL store %q", store)
	}
	// No unique constraint on the key: nothing but idem keeps a key from
	// committing twice.
	orders := fmt.Sprintf(`CREATE TABLE %s (id bigserial PRIMARY KEY, key text NOT NULL, exec text NOT NULL,
		pid int NOT NULL, seq bigint NOT NULL, rid text NOT NULL, owner text NOT NULL, at_ns bigint NOT NULL);
	CREATE INDEX ON %[1]s (key)`, e.ordT)
	if _, err := pool.Exec(ctx, orders); err != nil {
		t.Fatal(err)
	}
	return e
}

// flags are the idemserver flags of the database.
func (e *pgEnv) flags(more ...string) []string {
	return append([]string{"-pg", e.dsn, "-pg-store", e.store, "-pg-table", e.table, "-orders-table", e.orders}, more...)
}

// executions returns the order rows of keys, as executions: each row is
// a business change that committed.
func (e *pgEnv) executions(t testing.TB, ctx context.Context, keys []string) map[string][]execution {
	t.Helper()
	rows, err := e.pool.Query(ctx, "SELECT key, exec, pid, seq, rid, owner, at_ns FROM "+e.ordT+" WHERE key = ANY($1)", keys)
	if err != nil {
		t.Fatalf("reading the orders: %v", err)
	}
	out := make(map[string][]execution, len(keys))
	for rows.Next() {
		var key, id string
		var seq, ns int64
		var ex execution
		if err := rows.Scan(&key, &id, &ex.pid, &seq, &ex.rid, &ex.owner, &ns); err != nil {
			t.Fatal(err)
		}
		ex.seq, ex.at = strconv.FormatInt(seq, 10), time.Unix(0, ns)
		if ex.id() != id {
			t.Fatalf("order of %s: exec %q, pid %d, seq %d", key, id, ex.pid, seq)
		}
		out[key] = append(out[key], ex)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("reading the orders: %v", err)
	}
	for _, ex := range out {
		sortExecutions(ex)
	}
	return out
}

// states counts the records' entries by state.
func (e *pgEnv) states(t testing.TB, ctx context.Context) map[string]int {
	t.Helper()
	rows, err := e.pool.Query(ctx, "SELECT state, count(*) FROM "+e.idemT+" GROUP BY state")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for rows.Next() {
		var state string
		var n int
		if err := rows.Scan(&state, &n); err != nil {
			t.Fatal(err)
		}
		out[state] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// leasesLeft returns the number of entries in flight whose lease has not
// expired by the database's clock.
func (e *pgEnv) leasesLeft(t testing.TB, ctx context.Context) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(ctx, "SELECT count(*) FROM "+e.idemT+" WHERE state = 'processing' AND expires > "+e.now).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// secondsLeft is the SQL of the seconds from the database's clock to
// the time at, an expression of the records' table's times.
func (e *pgEnv) secondsLeft(at string) string {
	if e.store == "sqlstore" {
		return "((" + at + ") - " + e.now + ") / 1e6"
	}
	return "extract(epoch FROM (" + at + ") - " + e.now + ")"
}

// heldAny is the SQL of the number of entries held in flight, by the
// database's clock: in processing with their lease running, or
// committed within the lease of the execution that committed.
func (e *pgEnv) heldAny() string {
	return "SELECT count(*) FROM " + e.idemT + " WHERE held_until > " + e.now +
		" OR state = 'processing' AND expires > " + e.now
}

// TestPGExactlyOnceAcrossProcesses: three processes share one PostgreSQL;
// every key is sent as concurrent duplicates spread across them. Each
// key's order is committed exactly once (one business row), and every
// other duplicate gets that execution's response back byte for byte.
func TestPGExactlyOnceAcrossProcesses(t *testing.T) { onPGStores(t, testPGExactlyOnceAcrossProcesses) }

func testPGExactlyOnceAcrossProcesses(t *testing.T, store string) {
	const lease = 5 * time.Second
	env := newPG(t, pgtest.DSN(t), store)
	keys := envInt(t, "IDEM_E2E_KEYS", 2000)
	dups := envInt(t, "IDEM_E2E_DUPS", 5)
	workers := envInt(t, "IDEM_E2E_WORKERS", 64)
	ctx := deadline(t, 2*time.Minute+time.Duration(keys*dups)*4*time.Millisecond)

	srvs := startServers(t, 3, env.flags("-lease", lease.String(), "-delay", "2ms")...)
	l := newLoad(newClient(t), srvs, loadConfig{prefix: "pg-once-", dups: dups, workers: workers,
		backoff: 50 * time.Millisecond, maxAttempts: 1000})
	begin := time.Now()
	l.start(t, ctx, keys)
	l.wait(t, ctx)
	elapsed := time.Since(begin)

	replies := l.snapshot()
	execs := env.executions(t, ctx, l.keys)
	if int(l.started.Load()) != keys {
		t.Fatalf("%d keys sent, want %d", l.started.Load(), keys)
	}
	checkAnswers(t, srvs, replies, lease)
	once, executed := checkOnce(t, l, execs)
	once.report("exactly once")
	if st := env.states(t, ctx); st["done"] != keys || len(st) != 1 {
		t.Errorf("entries by state %v, want %d done", st, keys)
	}
	figure(t, "%d keys x %d duplicates over 3 processes on one PostgreSQL, %d in flight: %d requests, %d answered 409 and retried, "+
		"%d orders committed, %d replays, in %v (%.0f requests/s)",
		keys, dups, workers, len(replies), l.n409.Load(), executed, keys*dups-int(l.nExecuted.Load()),
		ms(elapsed), float64(len(replies))/elapsed.Seconds())
}

// TestPGKilledAfterCommit: a process is killed (SIGKILL) after its
// handlers committed their orders, with the fence, and before their
// responses were stored. Retries on the other processes never create a
// second order: while the dead process's leases run, they get the 409 of
// a request in flight, with Retry-After (the process could still store
// its responses); once they have run out, one process answers the
// documented 409 ErrNotReplayable, the other (idem.WithRebuild) the
// response rebuilt from the order row.
func TestPGKilledAfterCommit(t *testing.T) { onPGStores(t, testPGKilledAfterCommit) }

func testPGKilledAfterCommit(t *testing.T, store string) {
	const (
		lease = 1500 * time.Millisecond
		keys  = 200
	)
	env := newPG(t, pgtest.DSN(t), store)
	ctx := deadline(t, 2*time.Minute)
	base := slices.Clip(env.flags("-lease", lease.String()))
	srvs := startEach(t, append(base, "-gate-at", "after-commit"), base, append(base, "-rebuild"))
	victim, plain, rebuilt := srvs[0], 1, 2
	c := newClient(t)
	names := keyNames("pg-kill-", keys)

	victim.control(t, "POST", "/gate/close")
	held := make(chan *reply, keys)
	for _, key := range names {
		go func() { held <- c.post(ctx, srvs, 0, key, key+"/held", false) }()
	}
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// Each handler fences within its lease, which the victim renews on a
	// real clock: the test measures how long the machine kept it (and
	// the victim's answer to /gate/held) away meanwhile, to tell a fence
	// refused for a renewal that came late from a broken one.
	last, stall := time.Now(), time.Duration(0)
	for n := 0; n != keys; n = victim.held(t) {
		stall, last = max(stall, time.Since(last)-5*time.Millisecond), time.Now()
		select {
		case r := <-held:
			if r.err == nil && r.status == http.StatusConflict && stall >= lease/3 {
				t.Skipf("a request to the process at the gate was answered %v, its fence refused; but the machine stalled "+
					"the test for %v meanwhile, long enough for the renewals of a %v lease to come late: no verdict", r, ms(stall), lease)
			}
			t.Fatalf("a request to the process at the gate was answered (the test stalled at most %v): %v\n%s", ms(stall), r, victim.output())
		case <-waitCtx.Done():
			t.Fatalf("%d handlers at the gate, want %d: %v\n%s", n, keys, waitCtx.Err(), victim.output())
		case <-time.After(5 * time.Millisecond):
		}
	}
	// Each order is committed, with the fence, and no response is stored.
	before := env.executions(t, ctx, names)
	states := env.states(t, ctx)
	victim.kill()
	killed := time.Now()
	// The leases ran from the last renewal: the first runs out this long
	// after the kill, by the database's clock.
	var minLeft float64
	asked := time.Now() // the database reads its clock after this
	if err := env.pool.QueryRow(ctx, "SELECT coalesce("+env.secondsLeft("min(coalesce(held_until, expires))")+", 0)::float8 FROM "+
		env.idemT+" WHERE state <> 'done'").Scan(&minLeft); err != nil {
		t.Fatal(err)
	}
	// At least this long after the kill: the database's clock read after
	// asked, and the lease ran minLeft longer.
	leaseLeft := time.Duration(minLeft*float64(time.Second)) + asked.Sub(killed)
	for range keys {
		if r := <-held; r.err == nil {
			t.Errorf("held request answered before the kill: %v", r)
		}
	}
	for _, key := range names {
		if len(before[key]) != 1 {
			t.Fatalf("%s: %d orders before the kill, want 1", key, len(before[key]))
		}
	}
	if states["committed"] != keys {
		t.Errorf("entries at the kill %v, want %d committed", states, keys)
	}
	t.Logf("entries at the kill: %v", states)

	// A round of retries on both other processes before the leases run
	// out, and two after.
	bad := failures{t: t}
	var nInFlight, n409, nRebuilt, inLease int
	for _, key := range names {
		for srv := 1; srv <= 2; srv++ {
			r := c.post(ctx, srvs, srv, key, fmt.Sprintf("%s/early/%d", key, srv), false)
			within := r.recv.Sub(killed) < leaseLeft-50*time.Millisecond
			if within {
				inLease++
			}
			if r.err == nil && r.status == http.StatusConflict && !r.notReplayable() && checkRetryAfter(r, lease) == nil {
				nInFlight++
			} else if within {
				bad.add("%s: retry within the lease: %v, want 409 in flight with Retry-After", key, r)
			}
		}
	}
	early := time.Since(killed)
	noVerdict := ""
	switch {
	case nInFlight > 0:
	case inLease > 0:
		t.Errorf("no retry got the 409 in flight, though %d were answered within the lease (the round took %v)", inLease, ms(early))
	default:
		// Every retry came after the first lease ran out: the machine
		// was too slow for the test to see the entries in flight.
		noVerdict = fmt.Sprintf("no retry was answered within the lease, which ran out %v after the kill: a loaded machine; "+
			"no verdict on the entries in flight", ms(leaseLeft))
	}
	waitFor(t, ctx, "the killed process's leases to run out by the database's clock", func() bool {
		var n int
		err := env.pool.QueryRow(ctx, env.heldAny()).Scan(&n)
		return err == nil && n == 0
	})
	rebuilds := map[string]*reply{}
	round := func(name string) {
		for _, key := range names {
			order := before[key][0]
			if r := c.post(ctx, srvs, plain, key, key+"/"+name+"/plain", false); !r.notReplayable() || r.retryAfter != "" {
				bad.add("%s: %s retry without WithRebuild: %v, want 409 ErrNotReplayable without Retry-After", key, name, r)
			} else {
				n409++
			}
			r := c.post(ctx, srvs, rebuilt, key, key+"/"+name+"/rebuilt", false)
			switch prev := rebuilds[key]; {
			case r.err != nil || r.status != http.StatusCreated || !r.replayed || r.exec != order.id():
				bad.add("%s: %s retry with WithRebuild: %v, want 201 replayed from the order of %v", key, name, r, order)
			case prev != nil && !r.sameResponse(prev):
				bad.add("%s: %s retry with WithRebuild: %v, differs from the first rebuilt answer %v", key, name, r, prev)
			default:
				rebuilds[key] = r
				nRebuilt++
			}
		}
	}
	late := time.Since(killed)
	round("late")
	round("again")
	bad.report("retries after the kill")

	after := env.executions(t, ctx, names)
	twice := failures{t: t}
	for _, key := range names {
		if len(after[key]) != 1 {
			twice.add("%s: %d orders, want 1: %v", key, len(after[key]), after[key])
		}
	}
	twice.report("orders after the retries")
	figure(t, "lease %v, %d keys whose orders committed with the fence on the killed process before their responses were stored: "+
		"leases left at the kill at least %v; retries within %v of the kill: %d answered 409 in flight with Retry-After; from %v after the kill, when the leases had run out, "+
		"2 rounds: %d answered 409 ErrNotReplayable, %d rebuilt from the order (201 replayed); %d orders for %d keys",
		lease, keys, ms(leaseLeft), ms(early), nInFlight, ms(late), n409, nRebuilt, countRows(after), keys)
	if noVerdict != "" {
		t.Skip(noVerdict)
	}
}

// TestPGStaleCommitRefused: a process is stopped (SIGSTOP) in its
// handlers' transactions, after their orders were inserted and before the
// fence, for longer than the lease; the other processes take the keys and
// commit their orders. When the stopped process goes on, every fence finds
// its lease lost and the late transaction rolls back: one order per key,
// the one whose response the retries get.
func TestPGStaleCommitRefused(t *testing.T) { onPGStores(t, testPGStaleCommitRefused) }

func testPGStaleCommitRefused(t *testing.T, store string) {
	testStaleCommitRefused(t, newPG(t, pgtest.DSN(t), store), faultConfig{name: "PostgreSQL", prefix: "pg-stale-",
		lease: 1500 * time.Millisecond, keys: 50})
}

// countRows returns the number of orders.
func countRows(execs map[string][]execution) int {
	n := 0
	for _, ex := range execs {
		n += len(ex)
	}
	return n
}

// signal sends sig to the process.
func (s *server) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := syscall.Kill(s.pid, sig); err != nil {
		t.Fatalf("%v to idemserver %d: %v", sig, s.pid, err)
	}
}

// TestPGRestartFailsClosed: under load on three processes, their
// PostgreSQL crashes (an immediate shutdown: every connection breaks) and
// is restarted on the same port after at least 1.5 s and 100 answers.
// While it is down, every request gets 503 with Retry-After and no order
// is committed; the processes recover without a restart; no key gets a
// second order; every duplicate ends with its execution's response,
// replayed byte for byte (or, for an execution whose COMMIT was made
// durable as the server died but never acknowledged, the response
// rebuilt from its order); and every key asked again after the restart is
// replayed. The outage is shorter than two thirds of the lease, the least
// a lease has left between two renewals, so an execution that finished
// while the database was down gets its record stored by the middleware's
// retries once it is back.
func TestPGRestartFailsClosed(t *testing.T) { onPGStores(t, testPGRestartFailsClosed) }

func testPGRestartFailsClosed(t *testing.T, store string) {
	// IDEM_E2E_PG_SETTINGS tests the test: "synchronous_commit=off"
	// acknowledges commits that the crash may then lose.
	settings := strings.Fields(os.Getenv("IDEM_E2E_PG_SETTINGS"))
	if len(settings) > 0 {
		t.Logf("IDEM_E2E_PG_SETTINGS: %v", settings)
	}
	db := pgtest.StartProc(t, settings...)
	// The lease, 12 s, keeps the outage (1.5 s, the restart, up to 1.8 s
	// seen on an idle 2-core machine, and the processes' reconnection)
	// well within two thirds of it, as MariaDB's.
	testRestartFailsClosed(t, db, newPG(t, db.DSN(), store), faultConfig{name: "PostgreSQL", prefix: "pg-outage-",
		lease: 12 * time.Second, workers: 48, crash: "immediate shutdown"})
}
