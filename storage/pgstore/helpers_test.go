package pgstore_test

// The PostgreSQL helpers of this module's tests: a copy of
// internal/tests/pgxtest, which this module cannot require (that module
// requires this one).

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// testPool returns a pgx pool on [pgtest.DSN], configured by the given functions
// (for example a tracer, or [counter.Configure]) before it is created.
// It is closed when the test ends. It skips or fails the test like pgtest.DSN.
func testPool(t testing.TB, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.DSN(t))
	if err != nil {
		t.Fatalf("pgstore test: %v", err)
	}
	for _, f := range configure {
		f(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pgstore test: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// testTable returns a table name that no other test uses (idem_test_ and 16
// hex digits; nothing is created) and drops the table, if it was created,
// when the test ends. Call it after testPool, so that the table is dropped
// before the pool is closed.
func testTable(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	b := make([]byte, 8)
	rand.Read(b)
	name := "idem_test_" + hex.EncodeToString(b)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP TABLE IF EXISTS "+pgx.Identifier{name}.Sanitize()); err != nil {
			t.Errorf("pgstore test: dropping table %s: %v", name, err)
		}
	})
	return name
}

// counter counts what a pgx pool sends: statements (Query, QueryRow and
// Exec calls, through the connections' QueryTracer) and round trips (the
// writes of the connections' sockets: pgx writes the messages of one round
// trip at once, and a statement it prepares first costs two). Messages sent
// while a connection is set up are counted too, so use every connection
// once before counting. Install it with Configure; the zero value is ready
// and safe for concurrent use.
type counter struct {
	statements atomic.Int64
	writes     atomic.Int64
}

var _ pgx.QueryTracer = (*counter)(nil)

// Configure makes cfg's connections report to c: a pool option for
// [testPool]. It replaces the config's tracer, and wraps its dialer.
func (c *counter) Configure(cfg *pgxpool.Config) {
	cfg.ConnConfig.Tracer = c
	dial := cfg.ConnConfig.DialFunc
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &countingConn{Conn: conn, writes: &c.writes}, nil
	}
}

// Statements returns the statements sent since creation or the last Reset.
func (c *counter) Statements() int64 { return c.statements.Load() }

// RoundTrips returns the round trips since creation or the last Reset.
func (c *counter) RoundTrips() int64 { return c.writes.Load() }

// Reset sets both counts to zero.
func (c *counter) Reset() {
	c.statements.Store(0)
	c.writes.Store(0)
}

// TraceQueryStart implements pgx.QueryTracer: one statement.
func (c *counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.statements.Add(1)
	return ctx
}

// TraceQueryEnd implements pgx.QueryTracer.
func (c *counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c *countingConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}
