package pgstore

import (
	"context"
	"fmt"

	"github.com/idemkit/idem/storage"
	"github.com/jackc/pgx/v5"
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
//   - The request is not protected (it had no key, the middleware does not
//     cover it, or WithFailOpen ran the handler unprotected because the
//     store failed): Fence does nothing and returns nil. The transaction
//     then commits without the fence, as it would without idem.
//   - The execution holds the lease (its owner token, processing, the
//     lease not expired by the database's clock): in one statement, the
//     entry becomes committed in tx and expires after the Lease's TTL
//     (the middleware's WithTTL), no longer at the end of the lease. The statement locks the row FOR UPDATE
//     until tx ends. No statement of the store waits for that lock: while
//     tx is open, an Acquire or AcquireIssued of the key by another
//     request answers at once that it is in flight (the middleware's 409
//     with Retry-After, or WithWait's waiting), with the lease left as
//     the row showed it before the Fence, at least 1 ms (so Retry-After 1
//     s once that lease has run out while tx is still open); Issue of the
//     key answers ErrExists; and the owner's Extend, Complete and Release
//     answer [ErrLocked] at once, having changed nothing (the heartbeat
//     tries again at its next renewal; see Row locks in the package
//     documentation). Once tx commits, the handler never runs
//     again for the key within the TTL, whatever happens next: a retry
//     gets the stored response once the middleware has completed the
//     entry; before that, the 409 of a request in flight while this
//     execution's lease runs, and once it has run out (the process died
//     after the commit) Acquire answers [storage.Committed]: the
//     middleware's 409 ErrNotReplayable, "completed, but its response
//     was not stored", or WithRebuild's answer. If tx rolls
//     back, the entry is as it was: processing, with its lease.
//   - The lease was lost (it ran out, and the entry expired or another
//     execution took the key): Fence returns an error wrapping
//     [storage.ErrNotOwner], and the handler must roll tx back: a stale
//     execution cannot commit.
//
// Fence may be called again by the same execution, in the same or a later
// transaction; the entry stays committed and its TTL starts again. It
// returns an error wrapping [storage.ErrInvalid] when the context's Lease
// has no Key or Owner, or a TTL <= 0.
//
// Where to call it: under READ COMMITTED (PostgreSQL's default), anywhere
// in tx; as its last statement before COMMIT, it holds the row lock for
// the shortest time, and checks the lease as late as possible. Under
// REPEATABLE READ or SERIALIZABLE, make it tx's first statement: later, a
// lease the heartbeat extended after tx's snapshot was taken makes the
// UPDATE fail with a serialization failure (SQLSTATE 40001), which such
// transactions must be ready to retry anyway (first, the same can happen,
// rarely, when a renewal lands during the Fence). While tx holds the
// lock, the heartbeat cannot renew the lease (Extend answers ErrLocked):
// a transaction that runs longer than a lease after its Fence holds the
// key nonetheless (every Acquire finds it in flight until tx ends), but
// its lease has then run out when it commits, so that until the
// middleware's Complete (right after the handler returns) a retry gets
// 409 ErrNotReplayable rather than the 409 of a request in flight. Keep
// the time from the Fence to the commit shorter than the lease
// (WithLease): with the Fence as tx's last statement, it is.
//
// Upgrading from a version of this package whose Fence locked the row
// FOR NO KEY UPDATE: until every instance runs this one, a statement of
// this version may still wait for a transaction fenced by an older
// instance, as every statement of the older version did.
func (s *Store) Fence(ctx context.Context, tx pgx.Tx) error {
	l, ok := storage.LeaseFromContext(ctx)
	if !ok {
		return nil
	}
	if l.Key == "" || l.Owner == "" || l.TTL <= 0 {
		return fmt.Errorf("pgstore: fence: %w: key %q, owner %q, TTL %v", storage.ErrInvalid, l.Key, l.Owner, l.TTL)
	}
	tag, err := tx.Exec(ctx, s.sql.fence, bytes(l.Key), bytes(l.Owner), ms(l.TTL))
	if err != nil {
		return fmt.Errorf("pgstore: fence: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pgstore: fence: lease lost: %w", storage.ErrNotOwner)
	}
	return nil
}
