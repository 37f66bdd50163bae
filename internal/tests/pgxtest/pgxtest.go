// Package pgxtest gives tests pgx pools on the PostgreSQL server of
// internal/pgtest, fresh table names, and counts the statements and round
// trips a pool makes. storage/pgstore's own tests keep a copy of Pool and
// Table: its module cannot require this one, which requires it.
package pgxtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Pool returns a pgx pool on [pgtest.DSN], configured by the given functions
// (for example a tracer, or [Counter.Configure]) before it is created.
// It is closed when the test ends. It skips or fails the test like pgtest.DSN.
func Pool(t testing.TB, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.DSN(t))
	if err != nil {
		t.Fatalf("pgxtest: %v", err)
	}
	for _, f := range configure {
		f(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pgxtest: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Table returns a table name that no other test uses (idem_test_ and 16
// hex digits; nothing is created) and drops the table, if it was created,
// when the test ends. Call it after Pool, so that the table is dropped
// before the pool is closed.
func Table(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	b := make([]byte, 8)
	rand.Read(b)
	name := "idem_test_" + hex.EncodeToString(b)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP TABLE IF EXISTS "+pgx.Identifier{name}.Sanitize()); err != nil {
			t.Errorf("pgxtest: dropping table %s: %v", name, err)
		}
	})
	return name
}
