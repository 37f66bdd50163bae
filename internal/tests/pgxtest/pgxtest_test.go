package pgxtest_test

import (
	"context"
	"os"
	"testing"

	"github.com/idemkit/idem/internal/leakcheck"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/tests/pgxtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func TestMain(m *testing.M) { leakcheck.Main(pgtest.Wrap(m)) }

var ctx = context.Background()

func TestDSNIsSharedAndAnswers(t *testing.T) {
	a := pgtest.DSN(t)
	if b := pgtest.DSN(t); a != b {
		t.Fatalf("second DSN %q, first %q: want one server per test binary", b, a)
	}
	var v int
	if err := pgxtest.Pool(t).QueryRow(ctx, "SELECT 1").Scan(&v); err != nil || v != 1 {
		t.Fatalf("SELECT 1: %v, %v", v, err)
	}
}

func TestTableIsFreshAndDropped(t *testing.T) {
	pool := pgxtest.Pool(t)
	var name string
	t.Run("create", func(t *testing.T) {
		name = pgxtest.Table(t, pool)
		if other := pgxtest.Table(t, pool); other == name {
			t.Fatalf("two calls gave the same table %q", name)
		}
		if _, err := pool.Exec(ctx, "CREATE TABLE "+pgx.Identifier{name}.Sanitize()+" (x int)"); err != nil {
			t.Fatal(err)
		}
	})
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_class WHERE relname = $1", name).Scan(&n); err != nil || n != 0 {
		t.Fatalf("table %s after its test: %d of it (%v), want dropped", name, n, err)
	}
}

func TestCounter(t *testing.T) {
	var c pgxtest.Counter
	pool := pgxtest.Pool(t, c.Configure, func(cfg *pgxpool.Config) { cfg.MaxConns = 1 })
	// Set the connection up first.
	if _, err := pool.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	count := func(what string, statements, roundTrips int64, f func() error) {
		t.Helper()
		c.Reset()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if s, r := c.Statements(), c.RoundTrips(); s != statements || r != roundTrips {
			t.Errorf("%s: %d statements in %d round trips, want %d in %d", what, s, r, statements, roundTrips)
		}
	}
	const q = "SELECT $1::int + 1"
	var v int
	count("a statement prepared first", 1, 2, func() error { return pool.QueryRow(ctx, q, 1).Scan(&v) })
	count("the same statement again", 1, 1, func() error { return pool.QueryRow(ctx, q, 1).Scan(&v) })
	count("a simple query", 1, 1, func() error { _, err := pool.Exec(ctx, "SELECT 2"); return err })
	count("a transaction of one statement", 3, 3, func() error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return tx.QueryRow(ctx, q, 2).Scan(&v) })
	})
}

// TestSettings checks that the server DSN started listens on loopback
// only and runs with the settings that make tests fast.
func TestSettings(t *testing.T) {
	if os.Getenv(pgtest.EnvDSN) != "" {
		t.Skip("the server of " + pgtest.EnvDSN + " is not pgtest's")
	}
	pool := pgxtest.Pool(t)
	for name, want := range map[string]string{"fsync": "off", "listen_addresses": "127.0.0.1", "server_encoding": "UTF8"} {
		var got string
		if err := pool.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
}

// TestProcCrashKeepsCommits: a commit acknowledged before Crash is there
// after Restart, on the same DSN; while crashed, connections are refused.
func TestProcCrashKeepsCommits(t *testing.T) {
	p := pgtest.StartProc(t)
	if p.DSN() == pgtest.DSN(t) {
		t.Fatal("StartProc shares the shared server")
	}
	conn, err := pgx.Connect(ctx, p.DSN())
	if err != nil {
		t.Fatal(err)
	}
	var sc string
	if err := conn.QueryRow(ctx, "SHOW synchronous_commit").Scan(&sc); err != nil || sc != "on" {
		t.Fatalf("synchronous_commit %q, %v; want on", sc, err)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE kept (n int); INSERT INTO kept VALUES (1), (2)"); err != nil {
		t.Fatal(err)
	}
	p.Crash()
	if _, err := conn.Exec(ctx, "SELECT 1"); err == nil {
		t.Error("a connection of the crashed server still answers")
	}
	conn.Close(ctx)
	if c, err := pgx.Connect(ctx, p.DSN()); err == nil {
		c.Close(ctx)
		t.Fatal("connected to the crashed server")
	}
	p.Restart()
	conn, err = pgx.Connect(ctx, p.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM kept").Scan(&n); err != nil || n != 2 {
		t.Fatalf("after the restart: %d rows, %v; want 2", n, err)
	}
}
