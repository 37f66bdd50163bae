package sqlstore_test

import (
	"context"
	"database/sql"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/idemkit/idem/internal/mysqltest"
	"github.com/idemkit/idem/storage/sqlstore"
)

// counter counts the writes of a pool's connections: the driver writes
// each command (a query, a prepare, an execute) in one write, and waits
// for its answer, so writes are round trips. Connections count from their
// handshake on: use every connection once before counting.
type counter struct{ writes atomic.Int64 }

func (c *counter) RoundTrips() int64 { return c.writes.Load() }
func (c *counter) Reset()            { c.writes.Store(0) }

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c *countingConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

// testDB returns a *sql.DB on a database of the test's own on the shared
// server, closed (and the database dropped) when the test ends. configure
// may change the driver's config (a counter's dialer, say).
func testDB(t testing.TB, configure ...func(*mysql.Config)) *sql.DB {
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
	cfg, err := mysql.ParseDSN(mysqltest.WithDatabase(dsn, name))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range configure {
		f(cfg)
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(60)
	db.SetMaxIdleConns(60)
	t.Cleanup(func() { db.Close() })
	return db
}

// countWith makes cfg's connections report their writes to c.
func countWith(c *counter) func(*mysql.Config) {
	return func(cfg *mysql.Config) {
		cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			var d net.Dialer
			conn, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &countingConn{Conn: conn, writes: &c.writes}, nil
		}
	}
}

// open returns a store with its table on db, closed when the test ends.
func open(t testing.TB, db *sql.DB, opts ...sqlstore.Option) *sqlstore.Store {
	t.Helper()
	s, err := sqlstore.New(db, sqlstore.MySQL, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.CreateTable(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

// exec runs a statement on db ({table} stands for the default table).
func exec(t testing.TB, db *sql.DB, q string, args ...any) int64 {
	t.Helper()
	res, err := db.ExecContext(context.Background(), strings.ReplaceAll(q, "{table}", "`"+sqlstore.DefaultTable+"`"), args...)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	n, _ := res.RowsAffected()
	return n
}

// shift moves time forward by d for the default table's rows: every
// expiry comes d sooner.
func shift(t testing.TB, db *sql.DB, d time.Duration) {
	t.Helper()
	exec(t, db, "UPDATE {table} SET expires = expires - ?, held_until = held_until - ?", d.Microseconds(), d.Microseconds())
}

// state returns the state of key's row, "" when there is none.
func state(t testing.TB, db *sql.DB, key string) string {
	t.Helper()
	var s string
	err := db.QueryRow("SELECT state FROM `"+sqlstore.DefaultTable+"` WHERE `key` = ?", []byte(key)).Scan(&s)
	if err == sql.ErrNoRows {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// sameDB returns a second *sql.DB on db's database, with the session
// parameters params, closed when the test ends.
func sameDB(t testing.TB, db *sql.DB, params map[string]string) *sql.DB {
	t.Helper()
	var name string
	if err := db.QueryRow("SELECT DATABASE()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	cfg, err := mysql.ParseDSN(mysqltest.WithDatabase(mysqltest.DSN(t), name))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Params = params
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db2 := sql.OpenDB(conn)
	t.Cleanup(func() { db2.Close() })
	return db2
}
