package sqlstore

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/idemkit/idem/storage"
)

// Fence joins the handler's transaction tx to the request's entry: it
// checks that this execution still holds the lease and marks the entry
// committed in tx, so that the entry and the application's change commit
// together or not at all. Call it in every transaction of the handler
// that makes a change a retry must not make again, on the database of the
// store's table, with the request's context (or one derived from it, which
// carries the execution's [storage.Lease]); then commit. If it returns an
// error, roll tx back.
//
//   - The request is not protected (no Lease in ctx): Fence does nothing
//     and returns nil.
//   - The execution holds the lease (its owner token, processing, the
//     lease not expired by the database's clock): in one UPDATE, the
//     entry becomes committed in tx and expires after the Lease's TTL.
//     The UPDATE holds the row's exclusive lock until tx ends. No
//     statement of the store waits for that lock: while tx is open, an
//     Acquire or AcquireIssued of the key by another request answers at
//     once that it is in flight (it reads the row without a lock, and
//     sees it as it was before the Fence: the owner's processing row; a
//     row it is to take it probes with FOR UPDATE NOWAIT); Issue of the
//     key answers ErrExists; and the owner's Extend, Complete and Release
//     answer [ErrLocked] at once, having changed nothing. Once tx
//     commits, the handler never runs again for the key within the TTL:
//     a retry gets the stored response once the middleware has completed
//     the entry; before that, the 409 of a request in flight while this
//     execution's lease runs, and [storage.Committed] once it has run
//     out. If tx rolls back, the entry is as it was: processing, with its
//     lease.
//   - The lease was lost (it ran out, and the entry expired or another
//     execution took the key): Fence returns an error wrapping
//     [storage.ErrNotOwner], and the handler must roll tx back.
//
// Fence may be called again by the same execution, in the same or a later
// transaction; the entry stays committed and its TTL starts again. It
// returns an error wrapping [storage.ErrInvalid] when the context's Lease
// has no Key or Owner, or a TTL <= 0.
//
// Where to call it: as tx's last statement before COMMIT, so that it holds
// the row lock for the shortest time and checks the lease as late as
// possible. On MySQL, the UPDATE reads the newest committed row whatever
// tx's isolation level (InnoDB's locking reads do), so REPEATABLE READ,
// the default, needs nothing more. On PostgreSQL, under READ COMMITTED
// (its default) too; under REPEATABLE READ or SERIALIZABLE, an UPDATE of
// a row changed since tx's snapshot (the heartbeat's Extend renewing the
// lease) fails with a serialization failure (SQLSTATE 40001, returned
// wrapped): make the Fence tx's first statement there, and run tx again
// on 40001. On PostgreSQL, any error of the UPDATE aborts tx. Under REPEATABLE READ, a Fence that fails
// (ErrNotOwner) keeps a lock on the row it read, or on the gap where a
// row was not, until tx rolls back: roll back at once. While tx holds the
// lock, the heartbeat cannot renew the lease (Extend answers ErrLocked):
// keep the time from the Fence to the commit shorter than the lease.
//
// tx may come from the store's *sql.DB or from any other pool on the same
// database (a pool with settings of the application's own, or the one of
// an ORM).
//
// Round trips: one (the UPDATE), plus one the first time tx's connection
// prepares it. On a pool other than the store's, the driver's own
// statement handling decides (pgx caches the statement on its connection:
// one; go-sql-driver/mysql prepares, runs and closes it: two, or one with
// interpolateParams=true).
func (s *Store) Fence(ctx context.Context, tx *sql.Tx) error {
	l, ok := storage.LeaseFromContext(ctx)
	if !ok {
		return nil
	}
	if l.Key == "" || l.Owner == "" || l.TTL <= 0 {
		return fmt.Errorf("sqlstore: fence: %w: key %q, owner %q, TTL %v", storage.ErrInvalid, l.Key, l.Owner, l.TTL)
	}
	// Only on tx's connection: preparing on the pool would need a second
	// connection while tx holds one, and wait for it on a pool at its
	// limit. A statement prepared already is prepared on tx's connection
	// (once per connection); otherwise the driver prepares it there for
	// this call (Acquire prepares it on the pool).
	args := []any{ms(l.TTL), []byte(l.Key), []byte(l.Owner)}
	var (
		res sql.Result
		err error
	)
	if st := s.cached(s.sql.fence); st != nil {
		res, err = tx.StmtContext(ctx, st).ExecContext(ctx, args...)
		if err != nil && err.Error() == errForeignStmt {
			// tx is of another *sql.DB on the same database (a pool of
			// the application's own): database/sql refuses the store's
			// statement before sending anything, so tx is untouched.
			res, err = tx.ExecContext(ctx, s.sql.fence, args...)
		}
	} else {
		res, err = tx.ExecContext(ctx, s.sql.fence, args...)
	}
	if err != nil {
		return fmt.Errorf("sqlstore: fence: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("sqlstore: fence: %w", err)
	}
	if n == 0 {
		return fmt.Errorf("sqlstore: fence: lease lost: %w", storage.ErrNotOwner)
	}
	return nil
}

// errForeignStmt is database/sql's error for a *sql.Stmt of another
// *sql.DB given to Tx.StmtContext (unchanged since Go 1.0; it has no
// sentinel). TestFenceOtherPool fails if it ever changes.
const errForeignStmt = "sql: Tx.Stmt: statement from different database used"
