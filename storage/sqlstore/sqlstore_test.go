package sqlstore_test

import (
	"context"
	"database/sql"
	"io"
	"log"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/idemkit/idem/internal/leakcheck"
	"github.com/idemkit/idem/internal/mysqltest"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/sqlstore"
	"github.com/idemkit/idem/storage/storagetest"
)

// TestMain stops the shared MariaDB and checks for leaked goroutines (the
// janitor's among them).
// The driver's log of broken connections (TestRecordOverMaxAllowedPacket
// breaks one on purpose) is dropped.
func TestMain(m *testing.M) {
	mysql.SetLogger(log.New(io.Discard, "", 0))
	leakcheck.Main(mysqltest.Wrap(m))
}

// commit fences the owner's entry in a transaction that commits.
func commit(db *sql.DB, store *sqlstore.Store) func(ctx context.Context, key, owner string, ttl time.Duration) error {
	return func(ctx context.Context, key, owner string, ttl time.Duration) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if err := store.Fence(storage.ContextWithLease(ctx, storage.Lease{Key: key, Owner: owner, TTL: ttl}), tx); err != nil {
			return err
		}
		return tx.Commit()
	}
}

// TestContract runs the contract suite on the server's real clock, with
// the inspection and committed-entry clauses.
func TestContract(t *testing.T) {
	db := testDB(t)
	s := open(t, db)
	storagetest.Run(t, func(t *testing.T) storagetest.Harness {
		return storagetest.Harness{Store: s, Commit: commit(db, s)}
	})
}
