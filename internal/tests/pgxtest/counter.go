package pgxtest

import (
	"context"
	"net"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Counter counts what a pgx pool sends: statements (Query, QueryRow and
// Exec calls, through the connections' QueryTracer) and round trips (the
// writes of the connections' sockets: pgx writes the messages of one round
// trip at once, and a statement it prepares first costs two). Messages sent
// while a connection is set up are counted too, so use every connection
// once before counting. Install it with Configure; the zero value is ready
// and safe for concurrent use.
type Counter struct {
	statements atomic.Int64
	writes     atomic.Int64
}

var _ pgx.QueryTracer = (*Counter)(nil)

// Configure makes cfg's connections report to c: a pool option for
// [Pool]. It replaces the config's tracer, and wraps its dialer.
func (c *Counter) Configure(cfg *pgxpool.Config) { c.ConfigureConn(cfg.ConnConfig) }

// ConfigureConn is Configure for a connection's config, such as the one
// that pgx's database/sql driver (stdlib.OpenDB) opens its connections
// with.
func (c *Counter) ConfigureConn(cfg *pgx.ConnConfig) {
	cfg.Tracer = c
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &countingConn{Conn: conn, writes: &c.writes}, nil
	}
}

// Statements returns the statements sent since creation or the last Reset.
func (c *Counter) Statements() int64 { return c.statements.Load() }

// RoundTrips returns the round trips since creation or the last Reset.
func (c *Counter) RoundTrips() int64 { return c.writes.Load() }

// Reset sets both counts to zero.
func (c *Counter) Reset() {
	c.statements.Store(0)
	c.writes.Store(0)
}

// TraceQueryStart implements pgx.QueryTracer: one statement.
func (c *Counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.statements.Add(1)
	return ctx
}

// TraceQueryEnd implements pgx.QueryTracer.
func (c *Counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c *countingConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}
