package pgstore

import (
	"context"
	"fmt"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/storage"
	"github.com/jackc/pgx/v5"
)

// Fence joins the handler's transaction tx to the request's entry: it
// checks that this execution still holds the lease and marks the entry
// committed in tx, so that the entry and the application's change commit
// together or not at all. Call it in every transaction of the handler
// that makes a change a retry must not make again, on the database of the
// store's table, with the request's context (or one derived from it, which
// carries its [idem.Info]); then commit. If it returns an error, roll tx
// back.
//
//   - The request is not protected (it had no key, the middleware does not
//     cover it, or WithFailOpen ran the handler unprotected because the
//     store failed): Fence does nothing and returns nil. The transaction
//     then commits without the fence, as it would without idem.
//   - The execution holds the lease (its owner token, processing, the
//     lease not expired by the database's clock): in one statement, the
//     entry becomes committed in tx and expires after Info.TTL, no longer
//     at the end of the lease. The statement's row lock holds until tx
//     ends, so an Acquire of the key by another request waits for the
//     commit or the rollback. Once tx commits, the handler never runs
//     again for the key within the TTL, whatever happens next: a retry
//     gets the stored response once the middleware has completed the
//     entry; before that, the 409 of a request in flight while this
//     execution's lease runs, and once it has run out (the process died
//     after the commit) a 409 ErrNotReplayable, "completed, but its
//     response was not stored", or WithRebuild's answer. If tx rolls
//     back, the entry is as it was: processing, with its lease.
//   - The lease was lost (it ran out, and the entry expired or another
//     execution took the key): Fence returns an error wrapping
//     [storage.ErrNotOwner], and the handler must roll tx back: a stale
//     execution cannot commit.
//
// Fence may be called again by the same execution, in the same or a later
// transaction; the entry stays committed and its TTL starts again. It
// returns an error wrapping [storage.ErrInvalid] when the Info of a
// protected request has no StorageKey or Owner, or a TTL <= 0.
//
// Where to call it: under READ COMMITTED (PostgreSQL's default), anywhere
// in tx; as its last statement before COMMIT, it holds the row lock for
// the shortest time, and checks the lease as late as possible. Under
// REPEATABLE READ or SERIALIZABLE, make it tx's first statement: later, a
// lease the heartbeat extended after tx's snapshot was taken makes the
// UPDATE fail with a serialization failure (SQLSTATE 40001), which such
// transactions must be ready to retry anyway (first, the same can happen,
// rarely, when a renewal lands during the Fence). While tx holds
// the lock, the heartbeat's renewals of the lease wait for it too: a
// transaction that runs longer than a lease after its Fence holds the key
// nonetheless, since every Acquire waits for it.
func (s *Store) Fence(ctx context.Context, tx pgx.Tx) error {
	info, ok := idem.FromContext(ctx)
	if !ok || !info.Protected {
		return nil
	}
	if info.StorageKey == "" || info.Owner == "" || info.TTL <= 0 {
		return fmt.Errorf("pgstore: fence: %w: storage key %q, owner %q, TTL %v", storage.ErrInvalid, info.StorageKey, info.Owner, info.TTL)
	}
	tag, err := tx.Exec(ctx, s.sql.fence, bytes(info.StorageKey), bytes(info.Owner), ms(info.TTL))
	if err != nil {
		return fmt.Errorf("pgstore: fence: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pgstore: fence: lease lost: %w", storage.ErrNotOwner)
	}
	return nil
}
