//go:build unix

package e2e

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/mysqltest"
	"github.com/idemkit/idem/storage/sqlstore"

	_ "github.com/go-sql-driver/mysql"
)

// myEnv is the database of the MariaDB tests' servers (idemserver
// -mysql): a database of the test's own on a server of mysqltest (the
// shared one, or a Proc's), holding sqlstore's table and the orders
// table, created before the servers start and dropped when the test ends.
type myEnv struct {
	db  *sql.DB // the test's own, on the database
	dsn string  // naming the database
}

// myNow is the server's clock in microseconds since the Unix epoch, as
// sqlstore's MySQL dialect writes expires and held_until.
const myNow = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))"

// newMySQL creates the database and its tables on the server of the DSN
// server (without a database, as mysqltest gives it).
func newMySQL(t testing.TB, server string) *myEnv {
	t.Helper()
	root, err := sql.Open("mysql", server)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() }) // after the database is dropped
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := mysqltest.Database(t, func(q string) error {
		qctx, qcancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer qcancel()
		_, err := root.ExecContext(qctx, q)
		return err
	})
	e := &myEnv{dsn: mysqltest.WithDatabase(server, name)}
	if e.db, err = sql.Open("mysql", e.dsn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.db.Close() }) // before the database is dropped
	st, err := sqlstore.New(e.db, sqlstore.MySQL)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.CreateTable(ctx); err != nil {
		t.Fatal(err)
	}
	// No unique constraint on the key: nothing but idem keeps a key from
	// committing twice.
	if _, err := e.db.ExecContext(ctx, "CREATE TABLE orders (id bigint AUTO_INCREMENT PRIMARY KEY, `key` varchar(255) NOT NULL, "+
		"exec varchar(64) NOT NULL, pid int NOT NULL, seq bigint NOT NULL, rid varchar(255) NOT NULL, owner varchar(255) NOT NULL, "+
		"at_ns bigint NOT NULL, INDEX (`key`)) ENGINE=InnoDB"); err != nil {
		t.Fatal(err)
	}
	return e
}

// flags are the idemserver flags of the database.
func (e *myEnv) flags(more ...string) []string {
	return append([]string{"-mysql", e.dsn, "-orders-table", "orders"}, more...)
}

// executions returns the order rows of keys, as executions: each row is
// a business change that committed.
func (e *myEnv) executions(t testing.TB, ctx context.Context, keys []string) map[string][]execution {
	t.Helper()
	out := make(map[string][]execution, len(keys))
	for chunk := range slices.Chunk(keys, 500) {
		args := make([]any, len(chunk))
		for i, k := range chunk {
			args[i] = k
		}
		q := "SELECT `key`, exec, pid, seq, rid, owner, at_ns FROM orders WHERE `key` IN (?" + strings.Repeat(", ?", len(chunk)-1) + ")"
		rows, err := e.db.QueryContext(ctx, q, args...)
		if err != nil {
			t.Fatalf("reading the orders: %v", err)
		}
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
		rows.Close()
	}
	for _, ex := range out {
		sortExecutions(ex)
	}
	return out
}

// states counts sqlstore's entries by state.
func (e *myEnv) states(t testing.TB, ctx context.Context) map[string]int {
	t.Helper()
	rows, err := e.db.QueryContext(ctx, "SELECT state, count(*) FROM `"+sqlstore.DefaultTable+"` GROUP BY state")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
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
func (e *myEnv) leasesLeft(t testing.TB, ctx context.Context) int {
	t.Helper()
	var n int
	if err := e.db.QueryRowContext(ctx, "SELECT count(*) FROM `"+sqlstore.DefaultTable+"` WHERE state = 'processing' AND expires > "+
		myNow).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestMySQLExactlyOnceAcrossProcesses: three processes share one MariaDB
// through database/sql and sqlstore; every key is sent as concurrent
// duplicates spread across them. Each key's order is committed exactly
// once (one business row), and every other duplicate gets that
// execution's response back byte for byte.
func TestMySQLExactlyOnceAcrossProcesses(t *testing.T) {
	const lease = 5 * time.Second
	env := newMySQL(t, mysqltest.DSN(t))
	keys := envInt(t, "IDEM_E2E_MYSQL_KEYS", 1000)
	dups := envInt(t, "IDEM_E2E_DUPS", 5)
	workers := envInt(t, "IDEM_E2E_WORKERS", 32)
	ctx := deadline(t, 2*time.Minute+time.Duration(keys*dups)*10*time.Millisecond)

	srvs := startServers(t, 3, env.flags("-lease", lease.String(), "-delay", "2ms")...)
	l := newLoad(newClient(t), srvs, loadConfig{prefix: "my-once-", dups: dups, workers: workers,
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
	figure(t, "%d keys x %d duplicates over 3 processes on one MariaDB (database/sql, sqlstore), %d in flight: %d requests, "+
		"%d answered 409 and retried, %d orders committed, %d replays, in %v (%.0f requests/s)",
		keys, dups, workers, len(replies), l.n409.Load(), executed, keys*dups-int(l.nExecuted.Load()),
		ms(elapsed), float64(len(replies))/elapsed.Seconds())
}

// TestMySQLKilledAfterCommit: a process is killed (SIGKILL) after its
// handlers committed their orders on MariaDB, with sqlstore's fence in
// the same *sql.Tx, and before their responses were stored. Retries on
// the other processes never create a second order: while the dead
// process's leases run, they get the 409 of a request in flight, with
// Retry-After; once they have run out, one process answers the
// documented 409 ErrNotReplayable, the other (idem.WithRebuild) the
// response rebuilt from the order row.
func TestMySQLKilledAfterCommit(t *testing.T) {
	const (
		lease = 2 * time.Second
		keys  = 100
	)
	env := newMySQL(t, mysqltest.DSN(t))
	ctx := deadline(t, 2*time.Minute)
	base := slices.Clip(env.flags("-lease", lease.String()))
	srvs := startEach(t, append(base, "-gate-at", "after-commit"), base, append(base, "-rebuild"))
	victim, plain, rebuilt := srvs[0], 1, 2
	c := newClient(t)
	names := keyNames("my-kill-", keys)

	victim.control(t, "POST", "/gate/close")
	held := make(chan *reply, keys)
	for _, key := range names {
		go func() { held <- c.post(ctx, srvs, 0, key, key+"/held", false) }()
	}
	waitCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
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
	var minLeftUS int64
	asked := time.Now() // the database reads its clock after this
	if err := env.db.QueryRowContext(ctx, "SELECT COALESCE(MIN(COALESCE(held_until, expires)) - "+myNow+", 0) FROM `"+
		sqlstore.DefaultTable+"` WHERE state <> 'done'").Scan(&minLeftUS); err != nil {
		t.Fatal(err)
	}
	// At least this long after the kill: the database's clock read after
	// asked, and the lease ran minLeftUS longer.
	leaseLeft := time.Duration(minLeftUS)*time.Microsecond + asked.Sub(killed)
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
		err := env.db.QueryRowContext(ctx, "SELECT count(*) FROM `"+sqlstore.DefaultTable+"` WHERE held_until > "+myNow+
			" OR (state = 'processing' AND expires > "+myNow+")").Scan(&n)
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
	figure(t, "lease %v, %d keys whose orders committed on MariaDB with sqlstore's fence on the killed process before their responses were stored: "+
		"leases left at the kill at least %v; retries within %v of the kill: %d answered 409 in flight with Retry-After; from %v after the kill, "+
		"when the leases had run out, 2 rounds: %d answered 409 ErrNotReplayable, %d rebuilt from the order (201 replayed); %d orders for %d keys",
		lease, keys, ms(leaseLeft), ms(early), nInFlight, ms(late), n409, nRebuilt, countRows(after), keys)
	if noVerdict != "" {
		t.Skip(noVerdict)
	}
}

// TestMySQLProcCrashKeepsCommits: on mysqltest's private server (a Proc),
// every commit acknowledged before Crash (SIGKILL of mariadbd) is there
// after Restart, on the same DSN; while it is down, connections are
// refused. (internal/mysqltest, which imports no driver, tests Crash and
// Restart with the protocol's greeting and COM_PING; this is where the
// driver is.) IDEM_E2E_MYSQL_SETTINGS tests the test:
// "innodb_flush_log_at_trx_commit=0" acknowledges commits that the crash
// may then lose.
func TestMySQLProcCrashKeepsCommits(t *testing.T) {
	const rows = 300
	p := mysqltest.StartProc(t, mysqlSettings(t)...)
	ctx := deadline(t, 2*time.Minute)
	db, err := sql.Open("mysql", p.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var flush int
	if err := db.QueryRowContext(ctx, "SELECT @@innodb_flush_log_at_trx_commit").Scan(&flush); err != nil {
		t.Fatal(err)
	}
	t.Logf("innodb_flush_log_at_trx_commit = %d", flush)
	if _, err := db.ExecContext(ctx, "CREATE DATABASE kept"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE kept.rows (n int PRIMARY KEY) ENGINE=InnoDB"); err != nil {
		t.Fatal(err)
	}
	// One transaction per row, each acknowledged; the last right before
	// the crash.
	for n := range rows {
		if _, err := db.ExecContext(ctx, "INSERT INTO kept.rows VALUES (?)", n); err != nil {
			t.Fatal(err)
		}
	}
	p.Crash()
	if err := db.PingContext(ctx); err == nil {
		t.Fatal("the crashed server answered a ping")
	}
	p.Restart()
	var n int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM kept.rows").Scan(&n); err != nil || n != rows {
		t.Fatalf("after the restart: %d rows, %v; want the %d acknowledged", n, err, rows)
	}
}

// mysqlSettings returns the settings of IDEM_E2E_MYSQL_SETTINGS, for
// mysqltest.StartProc: a test of the tests.
func mysqlSettings(t testing.TB) []string {
	settings := strings.Fields(os.Getenv("IDEM_E2E_MYSQL_SETTINGS"))
	if len(settings) > 0 {
		t.Logf("IDEM_E2E_MYSQL_SETTINGS: %v", settings)
	}
	return settings
}

// TestMySQLStaleCommitRefused: a process is stopped (SIGSTOP) in its
// handlers' transactions on MariaDB, after their orders were inserted and
// before sqlstore's fence, for longer than the lease; the other processes
// take the keys and commit. When it goes on, every late fence is refused
// and its transaction rolls back: one order per key, the one every retry
// replays (see testStaleCommitRefused).
func TestMySQLStaleCommitRefused(t *testing.T) {
	testStaleCommitRefused(t, newMySQL(t, mysqltest.DSN(t)), faultConfig{name: "MariaDB", prefix: "my-stale-",
		lease: 2 * time.Second, keys: 50})
}

// TestMySQLRestartFailsClosed: under load on three processes, MariaDB is
// killed (SIGKILL of mariadbd: every connection breaks) and restarted on
// the same port and data after at least 1.5 s and 100 answers: 503 with
// Retry-After and no order while it is down, recovery without a restart,
// one order per key, every key replayed when asked again (see
// testRestartFailsClosed). Its server writes InnoDB's log at each commit
// (innodb_flush_log_at_trx_commit=1, mysqltest.StartProc's), so an
// acknowledged commit survives the kill. The lease, 12 s, keeps the
// outage (1.5 s, and the restart: up to 3 s seen with InnoDB's crash
// recovery on the loaded 2-core machine) well within two thirds of it.
func TestMySQLRestartFailsClosed(t *testing.T) {
	db := mysqltest.StartProc(t, mysqlSettings(t)...)
	testRestartFailsClosed(t, db, newMySQL(t, db.DSN()), faultConfig{name: "MariaDB", prefix: "my-outage-",
		lease: 12 * time.Second, workers: 32, crash: "SIGKILL of mariadbd"})
}
