package conformance

import (
	"context"
	"database/sql"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql" // registers "mysql"
	"github.com/idemkit/idem/internal/mysqltest"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/sqlstore"
)

// MySQL/MariaDB: a database of the test's own on the binary's shared
// server (skipped when MariaDB is not installed, unless
// IDEM_REQUIRE_MYSQL=1), with sqlstore's table.
func init() {
	storeKinds = append(storeKinds, storeKind{"mysql", func(t *testing.T) (storage.Store, func(time.Duration)) {
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
		db, err := sql.Open("mysql", mysqltest.WithDatabase(dsn, name))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		s, err := sqlstore.New(db, sqlstore.MySQL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		if err := s.CreateTable(t.Context()); err != nil {
			t.Fatal(err)
		}
		return s, func(d time.Duration) {
			t.Helper()
			_, err := db.ExecContext(t.Context(), "UPDATE `"+sqlstore.DefaultTable+"` SET expires = expires - ?, held_until = held_until - ?",
				d.Microseconds(), d.Microseconds())
			if err != nil {
				t.Fatalf("advancing the rows by %v: %v", d, err)
			}
		}
	}})
}
