package main

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/democlient"
	"github.com/idemkit/idem/examples/internal/demotest"
	"github.com/idemkit/idem/internal/httprec"
	"github.com/idemkit/idem/internal/mysqltest"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/sqlstore"
)

// The tests run the service on a real MariaDB (internal/mysqltest: a
// private server, or IDEM_MYSQL_DSN), each on a database of its own, so
// that they can run beside other packages' tests on the same server.

// TestDemo runs what `go run ./examples/mysql -mysql ... -demo` runs, twice
// on the same tables, as two runs of the command on one database: the
// second finds the tables made. Each transcript shows the promised
// answers, and one order per key.
func TestDemo(t *testing.T) {
	dsn := testDSN(t)
	c := config{dsn: dsn, table: sqlstore.DefaultTable, orders: "orders", demo: true}
	rowRE := regexp.MustCompile(`(?m)^order-([123])-([0-9a-f]{8}) \| 1$`)
	for i := range 2 {
		var out, logw demotest.Buffer
		if err := run(c, &out, &logw); err != nil {
			t.Fatalf("run %d: %v\ntranscript:\n%s\nlog:\n%s", i, err, out.String(), logw.String())
		}
		got := out.String()
		sections := transcript(got)
		first, retry := sections["first call: the handler runs"], sections["the client retries: replayed, the handler does not run again"]
		if !strings.Contains(first, "HTTP 201") || !strings.Contains(retry, "HTTP 201  Idempotent-Replayed: true") {
			t.Errorf("run %d: the first call and its retry:\n%s\n%s", i, first, retry)
		}
		if body := lastLine(first); !regexp.MustCompile(`^\{"order":\d+,"item":"book","amount":12,"created_at":"[^"]+Z"\}$`).MatchString(body) || lastLine(retry) != body {
			t.Errorf("run %d: the order %q and its replay %q, want the same order", i, body, lastLine(retry))
		}
		for _, want := range []string{"HTTP 422", "HTTP 409", fmt.Sprintf("%d identical requests at once", duplicates)} {
			if !strings.Contains(got, want) {
				t.Errorf("run %d: the transcript does not show %q:\n%s", i, want, got)
			}
		}
		rows := rowRE.FindAllStringSubmatch(got, -1)
		if len(rows) != 3 || rows[0][2] != rows[1][2] || rows[1][2] != rows[2][2] {
			t.Errorf("run %d: want one row for each of the run's 3 keys:\n%s", i, got)
		}
		// One execution per key: the first order, the double click, the burst.
		if n := strings.Count(logw.String(), "-> executed 201"); n != 3 {
			t.Errorf("run %d: %d executions, want 3; log:\n%s", i, n, logw.String())
		}
	}
	db := testPool(t, dsn)
	if n := count(t, db, c.orders, ""); n != 6 {
		t.Errorf("%d orders after two runs, want 6", n)
	}
}

// TestConfig: run refuses, with a message that says what to do, a missing
// database, a DSN the driver does not take or that names no database, and
// table names it cannot use, before it connects to anything; it never
// prints the DSN's password.
func TestConfig(t *testing.T) {
	for _, c := range []struct {
		config
		want string
	}{
		{config{}, "no database: give -mysql 'user:password@tcp("},
		{config{dsn: "u:s3cr3tpw@tcp(127.0.0.1:1/none", table: "idem_keys", orders: "orders"}, "-mysql: not a DSN that go-sql-driver/mysql accepts"},
		{config{dsn: "u:s3cr3tpw@tcp(127.0.0.1:1)/", table: "idem_keys", orders: "orders"}, "-mysql: the DSN names no database"},
		{config{dsn: "root@tcp(127.0.0.1:1)/none", table: "idem keys", orders: "orders"}, "sqlstore: invalid table name"},
		{config{dsn: "root@tcp(127.0.0.1:1)/none", table: "orders", orders: "orders"}, "idem's table and the orders table are both"},
	} {
		err := run(c.config, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "s3cr3tpw") {
			t.Errorf("%+v: %v, want an error saying %q, without the password", c.config, err, c.want)
		}
	}
	if err := run(config{}, io.Discard, io.Discard); !strings.Contains(err.Error(), "IDEM_MYSQL_DSN") {
		t.Errorf("without a database: %v, want a word on IDEM_MYSQL_DSN", err)
	}
}

// TestConcurrentDuplicates: identical requests at once make one order: the
// handler runs for one, and each other gets 409 or the byte-identical
// replay of its answer (stored, or rebuilt from the row in the moment
// between the commit and the storing of the response).
func TestConcurrentDuplicates(t *testing.T) {
	a := newApp(t)
	base, log := a.serve(a.svc.store)
	const n = 20
	replies := make([]reply, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			replies[i], errs[i] = post(base, "dup", `{"item":"pen","amount":3}`)
		})
	}
	close(start)
	wg.Wait()
	var ran []reply
	replays, conflicts := 0, 0
	for i, r := range replies {
		switch {
		case errs[i] != nil:
			t.Fatal(errs[i])
		case r.replayed():
			replays++
		case r.status == http.StatusConflict:
			conflicts++
			if !strings.Contains(string(r.body), "#ErrConflict") {
				t.Errorf("409 %s, want ErrConflict", r.body)
			}
		default:
			ran = append(ran, r)
		}
	}
	if len(ran) != 1 || ran[0].status != http.StatusCreated {
		t.Fatalf("the handler answered %d requests (%+v), want one 201", len(ran), ran)
	}
	for _, r := range replies {
		if r.replayed() && !r.same(ran[0]) {
			t.Errorf("replay %d %q %q, want the original %d %q %q", r.status, r.header.Get("Location"), r.body,
				ran[0].status, ran[0].header.Get("Location"), ran[0].body)
		}
	}
	if got := count(t, a.db, a.orders, "dup"); got != 1 {
		t.Errorf("%d orders for the key, want 1", got)
	}
	if got := strings.Count(log.String(), "-> executed"); got != 1 {
		t.Errorf("%d executions, want 1; log:\n%s", got, log.String())
	}
	t.Logf("%d requests: 1 executed, %d replayed, %d conflicts", n, replays, conflicts)
}

// TestProcessDiedAfterCommit: the first process commits the order with the
// fence and dies before its response is stored (its store reaches nothing
// after the handler). A retry, on another process, gets the order rebuilt
// from its row: the original response byte for byte, with
// Idempotent-Replayed: true, every time, without running the handler.
// While the database fails, the rebuild answers 503.
func TestProcessDiedAfterCommit(t *testing.T) {
	a := newApp(t)
	// The dead execution's lease: until it has run out, the store may
	// count the entry in flight (the execution might still store its
	// response), and a retry gets 409. A minute, so that the handler
	// fences well within it however loaded the machine (a short lease,
	// renewed on a real clock, could run out first); the test then ends
	// it by moving the entry's times back (endLease), not by waiting.
	const lease = time.Minute
	dying, _ := a.serve(&diesAfterCommit{Store: a.svc.store}, idem.WithLease(lease))
	const key, body = "died", `{"item":"book","amount":12}`
	orig := mustPost(t, dying, key, body)
	if orig.status != http.StatusCreated || orig.replayed() || orig.header.Get("Location") == "" {
		t.Fatalf("first: %d %v %s, want 201 with a Location", orig.status, orig.header, orig.body)
	}
	if s := a.entryState(); s != "committed" {
		t.Fatalf("idem's entry is %q after the process died, want committed (fenced, no response stored)", s)
	}

	a.endLease(lease)
	base, log := a.serve(a.svc.store, idem.WithWait(10*time.Second))
	for i := range 2 { // not stored: rebuilt for each retry
		r := mustPost(t, base, key, body)
		if !r.replayed() || !r.same(orig) || r.header.Get("Content-Type") != orig.header.Get("Content-Type") {
			t.Errorf("retry %d: %d %v %q, want the original %d %v %q, replayed", i, r.status, r.header, r.body, orig.status, orig.header, orig.body)
		}
	}
	if got := strings.Count(log.String(), "-> rebuilt 201"); got != 2 || strings.Contains(log.String(), "-> executed") {
		t.Errorf("want 2 rebuilt and no execution; log:\n%s", log.String())
	}
	if r := mustPost(t, base, key, `{"item":"book","amount":13}`); r.status != http.StatusUnprocessableEntity {
		t.Errorf("the key with another body: %d %s, want 422", r.status, r.body)
	}
	if got := count(t, a.db, a.orders, key); got != 1 {
		t.Errorf("%d orders for the key, want 1", got)
	}

	// Another instance whose database connections fail: 503, which the
	// client retries, not a replay.
	broken := *a.svc
	broken.db = closedDB(t)
	brokenURL, _ := a.serveService(&broken, a.svc.store)
	if r := mustPost(t, brokenURL, key, body); r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") != "1" || r.replayed() {
		t.Errorf("rebuild while the database fails: %d %v %s, want 503 with Retry-After: 1, not replayed", r.status, r.header, r.body)
	}

	// The order's Location serves it.
	res, err := http.Get(base + orig.header.Get("Location"))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || !bytes.Equal(got, orig.body) {
		t.Errorf("GET %s: %d %s, want 200 %s", orig.header.Get("Location"), res.StatusCode, got, orig.body)
	}
}

// Environment of the child process of TestProcessKilledAfterCommit.
const (
	envChild      = "IDEM_EXAMPLE_MYSQL_CHILD"       // set: the test binary is the service's process
	envChildDSN   = "IDEM_EXAMPLE_MYSQL_CHILD_DSN"   // its database
	envChildLease = "IDEM_EXAMPLE_MYSQL_CHILD_LEASE" // its middleware's lease
)

// TestProcessKilledAfterCommit: the service runs as a process of its own
// (this test binary, see child), its database session in another time
// zone (time_zone '+09:00'). Its handler commits the order with the fence;
// then, before the response is stored, the process gets SIGKILL. A retry
// on another instance gets the response rebuilt from the order's row: the
// status, Location and body byte for byte that the killed process was
// storing, created_at in UTC whatever the session's time zone, replayed,
// without running the handler; and the table holds exactly one order for
// the key.
func TestProcessKilledAfterCommit(t *testing.T) {
	a := newApp(t)
	// The child's lease: a minute, so that its handler fences well within
	// it however loaded the machine (a short lease, renewed on a real
	// clock, could run out first); the test ends it after the kill by
	// moving the entry's times back (endLease), not by waiting.
	const lease = time.Minute
	cmd := exec.Command(os.Args[0])
	sep := "?"
	if strings.Contains(a.dsn, "?") {
		sep = "&"
	}
	cmd.Env = append(os.Environ(), envChild+"=1", envChildDSN+"="+a.dsn+sep+"time_zone=%27%2B09%3A00%27",
		envChildLease+"="+lease.String())
	var stderr demotest.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	lines := make(chan string)
	t.Cleanup(func() {
		cmd.Process.Kill()
		for range lines {
		}
		<-exited
	})
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		exited <- cmd.Wait()
	}()
	next := func(prefix string) string {
		t.Helper()
		select {
		case l, ok := <-lines:
			if rest, found := strings.CutPrefix(l, prefix+" "); ok && found {
				return rest
			}
			t.Fatalf("the child printed %q, want %q ...; its stderr:\n%s", l, prefix, stderr.String())
		case <-time.After(30 * time.Second):
			t.Fatalf("the child printed no %q line in 30s; its stderr:\n%s", prefix, stderr.String())
		}
		return ""
	}

	base := "http://" + next("listening")
	const key, body = "killed", `{"item":"café","amount":12}`
	first := make(chan reply, 1)
	go func() { first <- mustPostAsync(base, key, body) }()
	record, err := base64.StdEncoding.DecodeString(next("committed"))
	if err != nil {
		t.Fatal(err)
	}
	// The order is committed and the response not stored: kill it now.
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for range lines {
	}
	err = <-exited
	exited <- err // for the cleanup
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the child ended with %v, want SIGKILL", err)
	}
	if r := <-first; r.err == nil {
		t.Logf("the killed process's client got %d %s before the kill", r.status, r.body)
	} else {
		t.Logf("the killed process's client got no answer: %v", r.err)
	}

	var orig httprec.Record
	if err := orig.UnmarshalBinary(record); err != nil {
		t.Fatal(err)
	}
	if orig.Status != http.StatusCreated || orig.Header.Get("Location") == "" {
		t.Fatalf("the killed process's response: %d %v %s, want 201 with a Location", orig.Status, orig.Header, orig.Body)
	}
	var o order
	if err := json.Unmarshal(orig.Body, &o); err != nil || o.Item != "café" || !strings.HasSuffix(string(orig.Body), "Z\"}\n") ||
		time.Since(o.CreatedAt).Abs() > time.Minute {
		t.Errorf("the killed process's body %s (%v): want the order, created_at now, in UTC", orig.Body, err)
	}
	if s := a.entryState(); s != "committed" {
		t.Fatalf("idem's entry is %q after the process was killed, want committed (fenced, no response stored)", s)
	}
	if got := count(t, a.db, a.orders, key); got != 1 {
		t.Fatalf("%d orders for the key after the kill, want 1", got)
	}

	a.endLease(lease)
	retries, log := a.serve(a.svc.store, idem.WithWait(10*time.Second))
	for i := range 2 {
		r := mustPost(t, retries, key, body)
		if !r.replayed() || r.status != orig.Status || r.header.Get("Location") != orig.Header.Get("Location") ||
			r.header.Get("Content-Type") != orig.Header.Get("Content-Type") || !bytes.Equal(r.body, orig.Body) {
			t.Errorf("retry %d: %d %v %q, want the killed process's %d %v %q, replayed", i, r.status, r.header, r.body, orig.Status, orig.Header, orig.Body)
		}
	}
	if got := strings.Count(log.String(), "-> rebuilt 201"); got != 2 || strings.Contains(log.String(), "-> executed") {
		t.Errorf("want 2 rebuilt and no execution; log:\n%s", log.String())
	}
	if got := count(t, a.db, a.orders, key); got != 1 {
		t.Errorf("%d orders for the key after the retries, want 1", got)
	}
}

// child is the process of TestProcessKilledAfterCommit: the service as run
// serves it, on the database of $IDEM_EXAMPLE_MYSQL_CHILD_DSN, with a store
// that, when the middleware stores a response (the handler's transaction
// has committed), prints "committed" and the record in base64, and then
// hangs until the process is killed. It prints "listening ADDR" first.
func child() int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	lease, err := time.ParseDuration(os.Getenv(envChildLease))
	if err != nil {
		return fail(err)
	}
	db, err := openDB(os.Getenv(envChildDSN))
	if err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := open(ctx, db, sqlstore.DefaultTable, "orders", democlient.NewClicks(), log.New(os.Stderr, "", 0))
	if err != nil {
		return fail(err)
	}
	m, err := idem.New(&hangsAfterCommit{Store: s.store}, append(s.options(), idem.WithLease(lease))...)
	if err != nil {
		return fail(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fail(err)
	}
	fmt.Printf("listening %s\n", ln.Addr())
	return fail((&http.Server{Handler: s.routes(m), ReadHeaderTimeout: 5 * time.Second}).Serve(ln))
}

// hangsAfterCommit is the child's store: its Complete tells the test that
// the order committed and hangs, for the test to kill the process.
type hangsAfterCommit struct{ storage.Store }

func (*hangsAfterCommit) Complete(_ context.Context, _, _ string, record []byte, _ time.Duration) error {
	fmt.Printf("committed %s\n", base64.StdEncoding.EncodeToString(record))
	select {} // until SIGKILL
}

// TestStaleExecutionRefused: an execution that lost its lease while it was
// held up (here by the test's locks, as by a long pause of its process)
// cannot commit: its Fence fails, its transaction rolls back and it
// answers 409; the retry that took the key creates the one order.
func TestStaleExecutionRefused(t *testing.T) {
	a := newApp(t)
	base, _ := a.serve(a.svc.store)
	const key, body = "stale", `{"item":"pen","amount":3}`
	ctx := context.Background()

	// Hold the order's key: the test's transaction inserts an order with
	// the request's idem_key, and the first execution, which takes the key,
	// waits at its INSERT for that transaction to end.
	ordersLock, err := a.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ordersLock.Rollback()
	skey := idem.StorageKey("", http.MethodPost, "POST /orders", key)
	execIn(t, ordersLock, "INSERT INTO "+quote(a.orders)+" (item, amount, created_at, idem_key) VALUES ('lock', 1, UTC_TIMESTAMP(6), ?)", skey)
	stale := make(chan reply, 1)
	go func() { stale <- mustPostAsync(base, key, body) }()
	a.waitLocked("INSERT INTO " + quote(a.orders))

	// Its lease runs out meanwhile: the test's transaction makes the
	// entry expired and holds its row, and the INSERT goes through: the
	// execution waits at its Fence (the store's own statements never wait
	// for a row lock: its heartbeat would answer ErrLocked and try again).
	entryLock, err := a.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer entryLock.Rollback()
	if n := execIn(t, entryLock, "UPDATE "+quote(a.table)+" SET expires = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))"); n != 1 {
		t.Fatalf("%d entries, want 1", n)
	}
	if err := ordersLock.Rollback(); err != nil {
		t.Fatal(err)
	}
	a.waitLocked("UPDATE " + quote(a.table))

	// A retry comes. It takes the key once the entry is unlocked, or, when
	// it reaches the database while the test's transaction or the stale
	// execution's refused one still holds the row, gets the 409 of a
	// request in flight, and its client tries again once the stale
	// execution has answered.
	fresh := make(chan reply, 1)
	go func() { fresh <- mustPostAsync(base, key, body) }()
	if err := entryLock.Commit(); err != nil {
		t.Fatal(err)
	}

	s, f := <-stale, <-fresh
	if s.err != nil || f.err != nil {
		t.Fatal(s.err, f.err)
	}
	if f.status == http.StatusConflict && strings.Contains(string(f.body), "#ErrConflict") {
		f = mustPost(t, base, key, body)
	}
	if s.status != http.StatusConflict || !strings.Contains(string(s.body), "#ErrConflict") || s.header.Get("Retry-After") == "" {
		t.Errorf("the stale execution: %d %v %s, want 409 ErrConflict with Retry-After", s.status, s.header, s.body)
	}
	if f.status != http.StatusCreated || f.replayed() {
		t.Errorf("the retry: %d %v %s, want 201, executed", f.status, f.header, f.body)
	}
	if got := count(t, a.db, a.orders, key); got != 1 {
		t.Errorf("%d orders, want 1", got)
	}
	if r := mustPost(t, base, key, body); !r.replayed() || !r.same(f) {
		t.Errorf("another retry: %d %v %s, want the replay of %s", r.status, r.header, r.body, f.body)
	}
}

// TestDatabaseDown: when the handler cannot reach the database, the client
// gets 503 with Retry-After and idem stores nothing (it releases the key):
// the retry, once the database is back, creates the order.
func TestDatabaseDown(t *testing.T) {
	a := newApp(t)
	broken := *a.svc
	broken.db = closedDB(t)
	down, downLog := a.serveService(&broken, a.svc.store)
	const key, body = "down", `{"item":"book","amount":12}`
	r := mustPost(t, down, key, body)
	if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") != "1" ||
		r.header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("database down: %d %v %s, want a 503 problem with Retry-After: 1", r.status, r.header, r.body)
	}
	if !strings.Contains(downLog.String(), "POST /orders: ") {
		t.Errorf("the database's error is not logged:\n%s", downLog.String())
	}
	up, _ := a.serve(a.svc.store)
	if r := mustPost(t, up, key, body); r.status != http.StatusCreated || r.replayed() {
		t.Errorf("the retry: %d %v %s, want 201, executed", r.status, r.header, r.body)
	}
	if got := count(t, a.db, a.orders, key); got != 1 {
		t.Errorf("%d orders, want 1", got)
	}
}

// TestKeyForgotten: once idem has forgotten a key (its TTL passed and the
// janitor deleted the entry), a request with the key runs the handler
// again, and the UNIQUE column refuses a second order: 409, one order.
func TestKeyForgotten(t *testing.T) {
	a := newApp(t)
	base, _ := a.serve(a.svc.store)
	const key, body = "forgotten", `{"item":"book","amount":12}`
	if r := mustPost(t, base, key, body); r.status != http.StatusCreated {
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	if _, err := a.db.Exec("DELETE FROM " + quote(a.table)); err != nil {
		t.Fatal(err)
	}
	r := mustPost(t, base, key, body)
	if r.status != http.StatusConflict || r.replayed() || !strings.Contains(string(r.body), "already created") {
		t.Errorf("after the TTL: %d %v %s, want 409, an order exists", r.status, r.header, r.body)
	}
	if got := count(t, a.db, a.orders, key); got != 1 {
		t.Errorf("%d orders, want 1", got)
	}
}

// testDSN returns the DSN of a database of the test's own on the shared
// server (internal/mysqltest), dropped when the test ends.
func testDSN(t *testing.T) string {
	t.Helper()
	dsn := mysqltest.DSN(t)
	admin, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	name := mysqltest.Database(t, func(q string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := admin.ExecContext(ctx, q)
		return err
	})
	return mysqltest.WithDatabase(dsn, name)
}

// testPool returns a pool on dsn, as run opens it, closed when the test
// ends.
func testPool(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := openDB(dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// app is the service on a database of its own.
type app struct {
	t             *testing.T
	dsn           string
	db            *sql.DB
	svc           *service
	table, orders string // idem's, the orders'
}

// newApp opens the service as run does, on a database of the test's own.
func newApp(t *testing.T) *app {
	t.Helper()
	dsn := testDSN(t)
	a := &app{t: t, dsn: dsn, db: testPool(t, dsn), table: sqlstore.DefaultTable, orders: "orders"}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	svc, err := open(ctx, a.db, a.table, a.orders, democlient.NewClicks(), log.New(io.Discard, "", 0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.store.Close() }) // after the servers, before the database is dropped
	a.svc = svc
	return a
}

// serve serves an instance of the service, whose middleware keeps its
// entries in store, with opts after the service's options, until the test
// ends. It returns its URL and the log of its middleware's decisions and
// its database errors.
func (a *app) serve(store storage.Store, opts ...idem.Option) (string, *demotest.Buffer) {
	return a.serveService(a.svc, store, opts...)
}

// serveService is serve for an instance of svc.
func (a *app) serveService(svc *service, store storage.Store, opts ...idem.Option) (string, *demotest.Buffer) {
	a.t.Helper()
	inst := *svc
	logw := new(demotest.Buffer)
	inst.clicks, inst.log = democlient.NewClicks(), log.New(logw, "", 0)
	m, err := idem.New(store, append(inst.options(), opts...)...)
	if err != nil {
		a.t.Fatal(err)
	}
	srv := httptest.NewServer(inst.routes(m))
	a.t.Cleanup(func() {
		srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := m.Shutdown(ctx); err != nil {
			a.t.Error(err)
		}
	})
	return srv.URL, logw
}

// entryState returns the state of the only entry of idem's table.
func (a *app) entryState() string {
	a.t.Helper()
	var s string
	if err := a.db.QueryRow("SELECT state FROM " + quote(a.table)).Scan(&s); err != nil {
		a.t.Fatal(err)
	}
	return s
}

// endLease moves the times of idem's entries d back, as if d had passed:
// a lease of d is over.
func (a *app) endLease(d time.Duration) {
	a.t.Helper()
	if _, err := a.db.Exec("UPDATE "+quote(a.table)+" SET expires = expires - ?, held_until = held_until - ?",
		d.Microseconds(), d.Microseconds()); err != nil {
		a.t.Fatal(err)
	}
}

// waitLocked waits until a statement of this database that starts with
// prefix waits for a row lock (information_schema.innodb_trx: the DSN's
// user needs the PROCESS privilege).
func (a *app) waitLocked(prefix string) {
	a.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		err := a.db.QueryRow(`SELECT count(*) FROM information_schema.innodb_trx t
			JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id
			WHERE t.trx_state = 'LOCK WAIT' AND p.db = DATABASE() AND t.trx_query LIKE CONCAT(?, '%')`, prefix).Scan(&n)
		if err != nil {
			a.t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			a.t.Fatalf("no statement %s... waits for a lock after 10s", prefix)
		}
		// Another session's state: polled, more than 100 ms apart, since
		// InnoDB refreshes the table's cache only once it has not been read
		// for 100 ms.
		time.Sleep(150 * time.Millisecond)
	}
}

// diesAfterCommit is the store of a process that dies once its handler has
// returned: the handler's transaction committed the order with the fence,
// and the response is never stored (Complete and Release reach nothing).
type diesAfterCommit struct{ storage.Store }

// errDied wraps ErrNotOwner, which the middleware does not retry.
var errDied = fmt.Errorf("the process died: %w", storage.ErrNotOwner)

func (*diesAfterCommit) Complete(context.Context, string, string, []byte, time.Duration) error {
	return errDied
}

func (*diesAfterCommit) Release(context.Context, string, string) error { return errDied }

// closedDB returns a pool that fails every request.
func closedDB(t *testing.T) *sql.DB {
	t.Helper()
	db, err := openDB(mysqltest.WithDatabase(mysqltest.DSN(t), "none"))
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	return db
}

// count returns the number of orders of key, or of all keys for "".
func count(t *testing.T, db *sql.DB, orders, key string) int {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT count(*) FROM "+quote(orders)+" WHERE ? = '' OR idempotency_key = ?", key, key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// execIn runs a statement in tx, and returns the rows it changed.
func execIn(t *testing.T, tx *sql.Tx, q string, args ...any) int64 {
	t.Helper()
	res, err := tx.Exec(q, args...)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// reply is an HTTP answer.
type reply struct {
	status int
	header http.Header
	body   []byte
	err    error
}

func (r reply) replayed() bool { return r.header.Get("Idempotent-Replayed") == "true" }

// same tells whether r has o's status, Location and body.
func (r reply) same(o reply) bool {
	return r.status == o.status && r.header.Get("Location") == o.header.Get("Location") && bytes.Equal(r.body, o.body)
}

// post sends POST /orders with the key and the JSON body.
func post(base, key, body string) (reply, error) {
	req, err := http.NewRequest(http.MethodPost, base+"/orders", strings.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return reply{status: res.StatusCode, header: res.Header, body: b}, err
}

func mustPost(t *testing.T, base, key, body string) reply {
	t.Helper()
	r, err := post(base, key, body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// mustPostAsync is post for another goroutine: its error is in the reply.
func mustPostAsync(base, key, body string) reply {
	r, err := post(base, key, body)
	r.err = err
	return r
}

// transcript splits a demo transcript into its sections, by title.
func transcript(s string) map[string]string {
	m := make(map[string]string)
	for _, sec := range strings.Split(s, "\n# ")[1:] {
		title, rest, _ := strings.Cut(sec, "\n")
		m[title] = strings.TrimSpace(rest)
	}
	return m
}

func lastLine(s string) string { return s[strings.LastIndexByte(s, '\n')+1:] }

// The JSON of an order has the columns of its row, and nothing else.
func TestOrderJSON(t *testing.T) {
	o := order{ID: 7, Item: "book", Amount: 12, CreatedAt: time.Date(2025, 6, 1, 10, 0, 0, 123456000, time.UTC)}
	w := httptest.NewRecorder()
	writeOrder(w, http.StatusCreated, o)
	want := `{"order":7,"item":"book","amount":12,"created_at":"2025-06-01T10:00:00.123456Z"}` + "\n"
	if w.Code != http.StatusCreated || w.Body.String() != want || w.Header().Get("Location") != "/orders/7" {
		t.Errorf("%d %v %s, want 201 Location /orders/7 %s", w.Code, w.Header(), w.Body, want)
	}
	var back order
	err := json.Unmarshal(w.Body.Bytes(), &back)
	if err != nil || back.ID != o.ID || back.Item != o.Item || back.Amount != o.Amount || !back.CreatedAt.Equal(o.CreatedAt) {
		t.Errorf("decoded %+v (%v), want %+v", back, err, o)
	}
}
