package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"testing"
	"unsafe"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/gin-gonic/gin"
	"github.com/idemkit/idem"
	"github.com/idemkit/idem/echoidem"
	"github.com/idemkit/idem/ginidem"
	"github.com/idemkit/idem/internal/dynamotest"
	"github.com/idemkit/idem/internal/leakcheck"
	"github.com/idemkit/idem/internal/mysqltest"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/redistest"
	"github.com/idemkit/idem/internal/tests/pgxtest"
	"github.com/idemkit/idem/internal/tests/redisx"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/dynamostore"
	"github.com/idemkit/idem/storage/memstore"
	"github.com/idemkit/idem/storage/pgstore"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/idemkit/idem/storage/sqlstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"
)

// TestMain stops the shared redis-server, PostgreSQL server, MariaDB and
// dynalite (and removes their data) and fails the run if a goroutine leaked
// (a lease heartbeat, a store's janitor, a pool's health check).
func TestMain(m *testing.M) {
	gin.SetMode(gin.ReleaseMode)
	leakcheck.Main(dynamotest.Wrap(mysqltest.Wrap(pgtest.Wrap(redistest.Wrap(m)))))
}

// The response every handler writes: 201, three headers and a 200-byte
// JSON body, or a 1 MiB body for the "large" case.
var (
	orderJSON = []byte(`{"id":42,"status":"created","customer":"c_8d2f","items":[{"sku":"A-1","qty":2},{"sku":"B-7","qty":1}],"total":{"amount":"129.90","currency":"EUR"},"created_at":"2026-11-22T20:20:00Z","note":"at door"}`)
	largeBody = bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB

	// requestJSON is the body of every POST.
	requestJSON = []byte(`{"customer":"c_8d2f","items":[{"sku":"A-1","qty":2},{"sku":"B-7","qty":1}]}`)
)

const (
	location  = "/orders/42"
	requestID = "2f1c7a9e-6f7d-4a8e-9f55-0d3c1b2a4e6f"
)

// storedHeaderBytes is what the stored headers of the small response weigh:
// the names and values of Content-Type, Location and X-Request-Id.
const storedHeaderBytes = len("Content-Type") + len("application/json") +
	len("Location") + len(location) + len("X-Request-Id") + len(requestID)

// handler says what the handlers of a setup do.
type handler struct {
	// large answers the 1 MiB body instead of orderJSON.
	large bool
	// tx, when not nil, runs before the handler answers, with the
	// request's context: the application's own transaction (see
	// orders.tx). When it fails, the handler answers 500.
	tx func(ctx context.Context) error
}

func (hd handler) body() []byte {
	if hd.large {
		return largeBody
	}
	return orderJSON
}

// Handlers for each framework. They drain the request body, as a real
// handler reads it, run hd.tx if there is one, and answer in one Write.
func stdHandler(hd handler) http.Handler {
	body := hd.body()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if hd.tx != nil {
			if err := hd.tx(r.Context()); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		}
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Location", location)
		h.Set("X-Request-Id", requestID)
		w.WriteHeader(http.StatusCreated)
		w.Write(body)
	})
}

func ginHandler(hd handler) gin.HandlerFunc {
	body := hd.body()
	return func(c *gin.Context) {
		io.Copy(io.Discard, c.Request.Body)
		if hd.tx != nil {
			if err := hd.tx(c.Request.Context()); err != nil {
				c.String(http.StatusInternalServerError, err.Error())
				return
			}
		}
		c.Header("Location", location)
		c.Header("X-Request-Id", requestID)
		c.Data(http.StatusCreated, "application/json", body)
	}
}

func echoHandler(hd handler) echo.HandlerFunc {
	body := hd.body()
	return func(c echo.Context) error {
		io.Copy(io.Discard, c.Request().Body)
		if hd.tx != nil {
			if err := hd.tx(c.Request().Context()); err != nil {
				return c.String(http.StatusInternalServerError, err.Error())
			}
		}
		h := c.Response().Header()
		h.Set("Location", location)
		h.Set("X-Request-Id", requestID)
		return c.Blob(http.StatusCreated, "application/json", body)
	}
}

// adapter mounts POST and GET /orders on one framework, with the
// middleware (m != nil) or without it (m == nil, the "bare" stack).
type adapter struct {
	name  string
	mount func(m *idem.Middleware, hd handler) http.Handler
	// route is the route the adapter hands to Middleware.Serve.
	route string
}

var adapters = []adapter{
	{"nethttp", func(m *idem.Middleware, hd handler) http.Handler {
		mux := http.NewServeMux()
		h := stdHandler(hd)
		if m != nil {
			h = nethttp.Middleware(m)(h)
		}
		mux.Handle("POST /orders", h)
		mux.Handle("GET /orders", h)
		return mux
	}, "POST /orders"},
	{"gin", func(m *idem.Middleware, hd handler) http.Handler {
		r := gin.New()
		hs := []gin.HandlerFunc{ginHandler(hd)}
		if m != nil {
			hs = []gin.HandlerFunc{ginidem.Middleware(m), ginHandler(hd)}
		}
		r.POST("/orders", hs...)
		r.GET("/orders", hs...)
		return r
	}, "/orders"},
	{"echo", func(m *idem.Middleware, hd handler) http.Handler {
		e := echo.New()
		var mw []echo.MiddlewareFunc
		if m != nil {
			mw = append(mw, echoidem.Middleware(m))
		}
		e.POST("/orders", echoHandler(hd), mw...)
		e.GET("/orders", echoHandler(hd), mw...)
		return e
	}, "/orders"},
}

// store is a store to measure, with its client when it has one.
type store struct {
	storage.Store
	mem *memstore.Store // the memory store, else nil

	rdb     *redis.Client // the Redis store's client, else nil
	counter *redisx.CommandCounter
	prefix  string // of the Redis keys

	pg        *pgstore.Store // the PostgreSQL store, else nil
	pool      *pgxpool.Pool  // its pool (postgres-sql: one beside the store's, not counted)
	pgCounter *pgxtest.Counter
	table     string // its table, as SQL

	sql        *sqlstore.Store // sqlstore on MariaDB or PostgreSQL, else nil
	db         *sql.DB         // its pool
	sqlPG      bool            // sqlstore's PostgreSQL dialect, through pgx's driver (its pgCounter counts)
	sqlCounter *sqlCounter
	sqlTable   string // its table, as SQL

	dynamo     *dynamostore.Store // the DynamoDB store, else nil
	ddb        *dynamodb.Client   // its client
	ddbCounter *requestCounter    // counts the client's HTTP requests
	ddbTable   string             // its table's name
}

// resetCount sets the count of round trips to the store's server to zero.
func (s store) resetCount() {
	switch {
	case s.counter != nil:
		s.counter.Reset()
	case s.pgCounter != nil:
		s.pgCounter.Reset()
	case s.sqlCounter != nil:
		s.sqlCounter.Reset()
	case s.ddbCounter != nil:
		s.ddbCounter.Reset()
	}
}

// roundTrips returns the round trips to the store's server since the last
// resetCount; always 0 for the memory store.
func (s store) roundTrips() int64 {
	switch {
	case s.counter != nil:
		return s.counter.Count()
	case s.pgCounter != nil:
		return s.pgCounter.RoundTrips()
	case s.sqlCounter != nil:
		return s.sqlCounter.RoundTrips()
	case s.ddbCounter != nil:
		return s.ddbCounter.RoundTrips()
	}
	return 0
}

// statements returns the statements sent to a SQL store's server since
// the last resetCount, and false for the other stores.
func (s store) statements() (int64, bool) {
	switch {
	case s.pgCounter != nil:
		return s.pgCounter.Statements(), true
	case s.sqlCounter != nil:
		return s.sqlCounter.Statements(), true
	}
	return 0, false
}

// trim deletes what the Redis, PostgreSQL, MySQL or DynamoDB store holds; it
// does nothing for the memory store, which bounds itself.
func (s store) trim(tb testing.TB) {
	ctx := context.Background()
	switch {
	case s.rdb != nil:
		var keys []string
		iter := s.rdb.Scan(ctx, 0, s.prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		if err := iter.Err(); err != nil {
			tb.Fatal(err)
		}
		if len(keys) > 0 {
			if err := s.rdb.Unlink(ctx, keys...).Err(); err != nil {
				tb.Fatal(err)
			}
		}
	case s.pool != nil:
		// TRUNCATE frees the rows and their TOASTed records at once, where
		// a DELETE would leave them to autovacuum, which might run during a
		// measurement.
		if _, err := s.pool.Exec(ctx, "TRUNCATE "+s.table); err != nil {
			tb.Fatal(err)
		}
	case s.db != nil:
		// TRUNCATE, as on PostgreSQL: a DELETE would leave InnoDB's purge
		// thread the records to free during a measurement.
		if _, err := s.db.ExecContext(ctx, "TRUNCATE TABLE "+s.sqlTable); err != nil {
			tb.Fatal(err)
		}
	case s.ddb != nil:
		// DynamoDB has no TRUNCATE: a Scan and batches of deletes.
		s.trimDynamoDB(tb)
	}
}

type storeKind struct {
	name string
	// open opens the store; large says it will hold 1 MiB records, which
	// must not pile up: a benchmark stores one per iteration.
	open func(tb testing.TB, large bool) store
}

// largeKept is how many 1 MiB records a store keeps at most during the
// large case: the memory store is bounded to that many entries (it evicts
// the oldest record as a full store does), and the keys of a Redis store
// or the rows of a PostgreSQL or MySQL store (the items of a DynamoDB store)
// are deleted each time that many were written, outside the measurement.
const largeKept = 64

var storeKinds = []storeKind{
	{"memory", func(tb testing.TB, large bool) store {
		var opts []memstore.Option
		if large {
			opts = append(opts, memstore.WithMaxEntries(largeKept))
		}
		s := memstore.New(opts...)
		tb.Cleanup(func() { s.Close() })
		return store{Store: s, mem: s}
	}},
	{"redis", func(tb testing.TB, large bool) store {
		addr := redistest.Addr(tb)
		// The options the README recommends, so
		// that the figures are those a user gets.
		rdb := redis.NewClient(redisstore.ClientOptions(addr))
		c := new(redisx.CommandCounter)
		rdb.AddHook(c)
		tb.Cleanup(func() {
			if os.Getenv(redistest.EnvAddr) == "" { // our own server: leave it clean
				rdb.FlushDB(context.Background())
			}
			rdb.Close()
		})
		prefix := "bench:" + rand.Text()[:8] + ":"
		return store{Store: redisstore.New(rdb, redisstore.WithPrefix(prefix)), rdb: rdb, counter: c, prefix: prefix}
	}},
	// PostgreSQL: a table of the setup's own on the test binary's server
	// (see internal/pgtest: skipped without PostgreSQL, unless
	// IDEM_REQUIRE_PG=1), through a pool with pgx's defaults.
	{"postgres", func(tb testing.TB, large bool) store {
		c := new(pgxtest.Counter)
		pool := pgxtest.Pool(tb, c.Configure, func(cfg *pgxpool.Config) {
			// pgx pings a connection acquired after a second idle: never
			// in a measurement loop, but after a pause (a slow test
			// machine, the trimming) a ping would be a round trip counted
			// against the request that follows.
			cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
		})
		table := pgxtest.Table(tb, pool)
		s, err := pgstore.New(pool, pgstore.WithTable(table))
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { s.Close() })
		if err := s.CreateTable(context.Background()); err != nil {
			tb.Fatal(err)
		}
		return store{Store: s, pg: s, pool: pool, pgCounter: c, table: pgx.Identifier{table}.Sanitize()}
	}},
	// sqlstore on MariaDB through database/sql and go-sql-driver/mysql: a
	// database of the setup's own on the test binary's server (see
	// internal/mysqltest: skipped without MariaDB, unless
	// IDEM_REQUIRE_MYSQL=1), with database/sql's pool defaults.
	{"mysql", func(tb testing.TB, large bool) store { return openMySQL(tb) }},
	// sqlstore's PostgreSQL dialect through database/sql and pgx's
	// driver (github.com/jackc/pgx/v5/stdlib), on the server of the
	// postgres store (see openSQLPostgres).
	{"postgres-sql", func(tb testing.TB, large bool) store { return openSQLPostgres(tb) }},
	// dynamostore: a table of the setup's own on the test binary's
	// dynalite (see internal/dynamotest: skipped without dynalite, unless
	// IDEM_REQUIRE_DYNAMODB=1), through the AWS SDK's DynamoDB client
	// with its defaults (see openDynamoDB). It has no Fence. With large,
	// the 1 MiB body is kept compressed: it must deflate to an item's
	// 400 KB, and does (openDynamoDB skips otherwise).
	{"dynamodb", func(tb testing.TB, large bool) store { return openDynamoDB(tb, large) }},
}

// storeKindNamed returns the store kind of that name.
func storeKindNamed(name string) storeKind {
	for _, sk := range storeKinds {
		if sk.name == name {
			return sk
		}
	}
	panic("no store kind " + name)
}

// discard is the cheapest ResponseWriter that still behaves like one: it
// keeps the status and counts the body, and its header map is cleared,
// not reallocated, between requests.
type discard struct {
	h      http.Header
	status int
	n      int
}

func newDiscard() *discard { return &discard{h: make(http.Header)} }

func (d *discard) Header() http.Header { return d.h }

func (d *discard) WriteHeader(code int) {
	if d.status == 0 {
		d.status = code
	}
}

func (d *discard) Write(p []byte) (int, error) {
	if d.status == 0 {
		d.status = http.StatusOK
	}
	d.n += len(p)
	return len(p), nil
}

func (d *discard) reset() { clear(d.h); d.status, d.n = 0, 0 }

// body is a request body that can be rewound.
type body struct{ bytes.Reader }

func (*body) Close() error { return nil }

// client sends requests to one handler, reusing the request, its body and
// the writer, so that the handler is all that is measured.
type client struct {
	h    http.Handler
	w    *discard
	r    *http.Request
	body *body
	// key is the Idempotency-Key value; setKey rewrites it in place.
	key []byte
}

func newClient(h http.Handler, method string) *client {
	c := &client{h: h, w: newDiscard(), body: new(body)}
	c.r = httptest.NewRequest(method, "/orders", nil)
	c.r.Header.Set("Content-Type", "application/json")
	c.r.Header.Set("Authorization", "Bearer 7f3a0c21")
	c.r = c.r.WithContext(idem.ContextWithPrincipal(c.r.Context(), "user-7f3a")) // as the authentication would
	c.key = []byte("order-0000000000")
	c.r.Header.Set("Idempotency-Key", string(c.key))
	return c
}

// setKey makes the key "order-<n>" without allocating: the header value
// is the key buffer itself. This is safe here because the middleware keeps
// no reference to the client's key after the request (stores keep a hash).
func (c *client) setKey(n uint64) {
	c.key = strconv.AppendUint(c.key[:len("order-")], n, 10)
	c.r.Header["Idempotency-Key"][0] = unsafe.String(&c.key[0], len(c.key))
}

// send sends the request once; c.w holds the answer.
func (c *client) send() {
	c.w.reset()
	if c.r.Method == http.MethodPost {
		c.body.Reset(requestJSON)
		c.r.Body, c.r.ContentLength = c.body, int64(len(requestJSON))
	}
	c.h.ServeHTTP(c.w, c.r)
}

// setup is one adapter on one store: the middleware, the protected stack
// and the bare one.
type setup struct {
	adapter adapter
	store   store
	m       *idem.Middleware
	h, bare http.Handler
}

// newSetup opens a store of kind sk and mounts a on it; large selects the
// handlers that answer 1 MiB.
func newSetup(tb testing.TB, a adapter, sk storeKind, large bool) *setup {
	return newSetupOn(tb, a, sk.open(tb, large), handler{large: large})
}

// newSetupOn mounts a's stacks with hd's handlers on st.
func newSetupOn(tb testing.TB, a adapter, st store, hd handler) *setup {
	s := &setup{adapter: a, store: st}
	var err error
	if s.m, err = idem.New(st.Store); err != nil { // the store itself, with its optional interfaces
		tb.Fatal(err)
	}
	s.h, s.bare = a.mount(s.m, hd), a.mount(nil, hd)
	return s
}

// hold makes a request with key on s's route whose handler does not
// return until the returned function is called, so that requests with the
// same key conflict meanwhile.
func (s *setup) hold(tb testing.TB, key string) (release func()) {
	c := newClient(nil, http.MethodPost)
	c.r.Header.Set("Idempotency-Key", key)
	c.body.Reset(requestJSON)
	c.r.Body, c.r.ContentLength = c.body, int64(len(requestJSON))
	started, stop, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		s.m.Serve(c.w, c.r, s.adapter.route, func(http.ResponseWriter, *http.Request) {
			close(started)
			<-stop
		})
	}()
	select {
	case <-started:
	case <-done:
		tb.Fatalf("hold: the handler did not run (status %d)", c.w.status)
	}
	return func() { close(stop); <-done }
}
