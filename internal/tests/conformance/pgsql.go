package conformance

import (
	"testing"
	"time"

	"github.com/idemkit/idem/internal/tests/pgxtest"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/sqlstore"
	"github.com/jackc/pgx/v5/stdlib"
)

// PostgreSQL on database/sql: sqlstore's PostgreSQL dialect through pgx's
// database/sql driver, on a table of the test's own on the binary's shared
// server (skipped when PostgreSQL is not installed, unless
// IDEM_REQUIRE_PG=1).
func init() {
	storeKinds = append(storeKinds, storeKind{"postgres-sql", func(t *testing.T) (storage.Store, func(time.Duration)) {
		pool := pgxtest.Pool(t)
		table := pgxtest.Table(t, pool)
		db := stdlib.OpenDBFromPool(pool)
		t.Cleanup(func() { db.Close() })
		s, err := sqlstore.New(db, sqlstore.PostgreSQL, sqlstore.WithTable(table))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		if err := s.CreateTable(t.Context()); err != nil {
			t.Fatal(err)
		}
		return s, func(d time.Duration) {
			t.Helper()
			_, err := db.ExecContext(t.Context(), `UPDATE "`+table+`" SET expires = expires - $1, held_until = held_until - $1`, d.Microseconds())
			if err != nil {
				t.Fatalf("advancing the rows by %v: %v", d, err)
			}
		}
	}})
}
