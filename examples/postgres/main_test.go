package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/democlient"
	"github.com/idemkit/idem/examples/internal/demotest"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/tests/pgxtest"
	"github.com/idemkit/idem/storage"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The tests run the service on a real PostgreSQL (internal/pgtest: a
// private server, or IDEM_PG_DSN), each on tables of its own, so that they
// can run beside other packages' tests on the same server.

// TestDemo runs what `go run ./examples/postgres -pg ... -demo` runs, twice
// on the same tables, as two runs of the command on one database: the
// second finds the tables made. Each transcript shows the promised
// answers, and one order per key.
func TestDemo(t *testing.T) {
	pool := pgxtest.Pool(t)
	c := config{dsn: pgtest.DSN(t), table: pgxtest.Table(t, pool), orders: pgxtest.Table(t, pool), demo: true}
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
	if n := count(t, pool, c.orders, ""); n != 6 {
		t.Errorf("%d orders after two runs, want 6", n)
	}
}

// TestConfig: run refuses, with a message that says what to do, a missing
// database and table names it cannot use, before it connects to anything.
func TestConfig(t *testing.T) {
	for _, c := range []struct {
		config
		want string
	}{
		{config{}, "no database: give -pg 'postgres://"},
		{config{dsn: "postgres://127.0.0.1:1/none", table: "idem keys", orders: "orders"}, "pgstore: invalid table name"},
		{config{dsn: "postgres://127.0.0.1:1/none", table: "orders", orders: "orders"}, "idem's table and the orders table are both"},
	} {
		err := run(c.config, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error saying %q", c.config, err, c.want)
		}
	}
	if err := run(config{}, io.Discard, io.Discard); !strings.Contains(err.Error(), "IDEM_PG_DSN") {
		t.Errorf("without a database: %v, want a word on IDEM_PG_DSN", err)
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
	if got := count(t, a.pool, a.orders, "dup"); got != 1 {
		t.Errorf("%d orders for the key, want 1", got)
	}
	if got := strings.Count(log.String(), "-> executed"); got != 1 {
		t.Errorf("%d executions, want 1; log:\n%s", got, log.String())
	}
	t.Logf("%d requests: 1 executed, %d replayed, %d conflicts", n, replays, conflicts)
}

// TestProcessDiedAfterCommit: the first process commits the order with the
// fence and dies before its response is stored. A retry, on another
// process, gets the order rebuilt from its row: the original response byte
// for byte, with Idempotent-Replayed: true, every time, without running
// the handler. While the database fails, the rebuild answers 503.
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
	if got := count(t, a.pool, a.orders, key); got != 1 {
		t.Errorf("%d orders for the key, want 1", got)
	}

	// Another instance whose database connections fail: 503, which the
	// client retries, not a replay.
	broken := *a.svc
	broken.pool = closedPool(t)
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

// TestStaleExecutionRefused: an execution that lost its lease while it was
// held up (here by the test's locks, as by a long pause of its process)
// cannot commit: its Fence fails, its transaction rolls back and it
// answers 409; the retry that took the key creates the one order.
func TestStaleExecutionRefused(t *testing.T) {
	a := newApp(t)
	base, _ := a.serve(a.svc.store)
	const key, body = "stale", `{"item":"pen","amount":3}`
	ctx := context.Background()

	// Hold the orders table: the first execution takes the key, then
	// waits at its INSERT.
	ordersLock, err := a.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ordersLock.Rollback(ctx)
	if _, err := ordersLock.Exec(ctx, "LOCK TABLE "+ident(a.orders)+" IN SHARE MODE"); err != nil {
		t.Fatal(err)
	}
	stale := make(chan reply, 1)
	go func() { stale <- mustPostAsync(base, key, body) }()
	a.waitLocked(a.orders)

	// Hold the key's entry, and let the INSERT through: the execution
	// waits at its Fence. FOR SHARE holds off the Fence (FOR UPDATE) and
	// the store's writes, as a long pause of the process would let them
	// queue; FOR UPDATE would be taken for an open fenced transaction,
	// which duplicates answer as in flight without waiting.
	entryLock, err := a.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer entryLock.Rollback(ctx)
	var skey []byte
	if err := entryLock.QueryRow(ctx, "SELECT key FROM "+ident(a.table)+" FOR SHARE").Scan(&skey); err != nil {
		t.Fatal(err)
	}
	if err := ordersLock.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	a.waitLocked(a.table)

	// Its lease runs out meanwhile, and a retry comes. It takes the key
	// once the entry is unlocked, or, when it reaches the database while
	// the stale execution's refused transaction still holds the row, gets
	// the 409 of a request in flight, and its client tries again once the
	// stale execution has answered.
	if _, err := entryLock.Exec(ctx, "UPDATE "+ident(a.table)+" SET expires = clock_timestamp() WHERE key = $1", skey); err != nil {
		t.Fatal(err)
	}
	fresh := make(chan reply, 1)
	go func() { fresh <- mustPostAsync(base, key, body) }()
	if err := entryLock.Commit(ctx); err != nil {
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
	if got := count(t, a.pool, a.orders, key); got != 1 {
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
	broken.pool = closedPool(t)
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
	if got := count(t, a.pool, a.orders, key); got != 1 {
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
	if _, err := a.pool.Exec(context.Background(), "DELETE FROM "+ident(a.table)); err != nil {
		t.Fatal(err)
	}
	r := mustPost(t, base, key, body)
	if r.status != http.StatusConflict || r.replayed() || !strings.Contains(string(r.body), "already created") {
		t.Errorf("after the TTL: %d %v %s, want 409, an order exists", r.status, r.header, r.body)
	}
	if got := count(t, a.pool, a.orders, key); got != 1 {
		t.Errorf("%d orders, want 1", got)
	}
}

// app is the service on tables of its own.
type app struct {
	t             *testing.T
	pool          *pgxpool.Pool
	svc           *service
	table, orders string // idem's, the orders'
}

// newApp opens the service as run does, on tables of the test's own.
func newApp(t *testing.T) *app {
	t.Helper()
	pool := pgxtest.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 12 })
	a := &app{t: t, pool: pool, table: pgxtest.Table(t, pool), orders: pgxtest.Table(t, pool)}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	svc, err := open(ctx, pool, a.table, a.orders, democlient.NewClicks(), log.New(io.Discard, "", 0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.store.Close() }) // after the servers, before the tables are dropped
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
	if err := a.pool.QueryRow(context.Background(), "SELECT state FROM "+ident(a.table)).Scan(&s); err != nil {
		a.t.Fatal(err)
	}
	return s
}

// endLease moves the times of idem's entries d back, as if d had passed:
// a lease of d is over.
func (a *app) endLease(d time.Duration) {
	a.t.Helper()
	if _, err := a.pool.Exec(context.Background(), "UPDATE "+ident(a.table)+
		" SET expires = expires - $1::bigint * interval '1 microsecond', held_until = held_until - $1::bigint * interval '1 microsecond'",
		d.Microseconds()); err != nil {
		a.t.Fatal(err)
	}
}

// waitLocked waits until a statement on table waits for a lock.
func (a *app) waitLocked(table string) {
	a.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		err := a.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND position($1 in query) > 0`, table).Scan(&n)
		if err != nil {
			a.t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			a.t.Fatalf("no statement on %s waits for a lock after 10s", table)
		}
		time.Sleep(2 * time.Millisecond) // another session's state: polled
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

// closedPool returns a pool that fails every request.
func closedPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	pool.Close()
	return pool
}

// count returns the number of orders of key, or of all keys for "".
func count(t *testing.T, pool *pgxpool.Pool, orders, key string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+ident(orders)+" WHERE $1 = '' OR idempotency_key = $1", key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func ident(table string) string { return pgx.Identifier{table}.Sanitize() }

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
