// Package pgstore is a [storage.Store] on PostgreSQL, shared by every
// instance of a service, whose entries can commit in the same transaction
// as the application's own change:
//
//	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
//	store, err := pgstore.New(pool)
//	err = store.CreateTable(ctx) // or run pgstore.Schema's SQL in your migrations
//	defer store.Close()
//	m, err := idem.New(store)
//
// # Exactly once with the application's database
//
// A store outside the application's database ends "runs once" at its own
// record: a handler that commits an order and then dies (kill -9) before
// its response is stored leaves an entry in flight; its lease runs out, the
// retry runs the handler again, and the order exists twice. A handler that
// outlives its lease can commit after another execution took the key. The
// remedy payment systems use is the deduplication table: a row with a
// unique key, written in the same local transaction as the business
// change, so that both commit or neither does.
//
// [Store.Fence] is that row's write. A handler calls it inside its own
// transaction; it checks that the execution still holds the lease and marks
// the entry committed, holding the row's lock until the transaction ends:
//
//	tx, err := pool.Begin(ctx)
//	...
//	_, err = tx.Exec(ctx, "INSERT INTO orders ...")
//	...
//	if err := store.Fence(ctx, tx); err != nil {
//		tx.Rollback(ctx) // the lease was lost: another execution has the key
//		return err
//	}
//	err = tx.Commit(ctx)
//
// Once the transaction commits, the handler never runs again for that key
// within the TTL: a retry gets the stored response; while the execution
// that committed may still store it (its lease runs), the 409 of a request
// in flight, with Retry-After; and once that lease has run out without a
// stored response (the process died between the commit and the storing of
// the response), 409 ErrNotReplayable ("completed, but its response was not
// stored"), or what idem.WithRebuild answers, instead of a second order. A request the middleware does not protect (no key,
// or WithFailOpen ran it unprotected) is not fenced: Fence returns nil and
// the transaction commits as it would without idem.
//
// What remains the application's:
//
//   - to call Fence in every transaction whose change must not be made
//     twice, on the database of the store's table, and to roll back when
//     Fence fails;
//   - effects outside that database (a payment provider, an e-mail, a
//     message broker) are not covered by its transaction: give them an
//     idempotency key of their own (the client's key, or Info.Owner as a
//     fencing token), or write them to an outbox table in the same
//     transaction;
//   - a TTL at least as long as clients retry: after it, the key is
//     forgotten, and a retry runs the handler again.
//
// # States
//
// An entry is one row (see [Schema]): issued (by [Store.Issue]: a
// [storage.Issuer]'s key that no execution has taken yet), processing (an
// execution holds the lease), committed (the execution's transaction
// committed with Fence) or done (it holds the response). A processing row
// taken from an issue keeps the TTL (the column issue_ttl), to
// become issued again when released; once committed or done, it forgets
// it. The committed state changes the [storage.Store] protocol in these
// ways, and only for the owner that fenced:
//
//   - While the transaction that fenced is open, the entry is in flight
//     for every other request (see Row locks): the 409 with Retry-After.
//   - The entry lives for the TTL from the Fence, and keeps the lease of
//     the execution that committed it (the column held_until), which the
//     owner's Extend renews until it runs out. Acquire of a committed entry
//     answers [storage.InFlight] while that lease runs: the execution may
//     still store its response, and a duplicate that arrives between the
//     COMMIT and the storing of the response gets 409 with Retry-After (or
//     waits, with WithWait), as for any request in flight, and then the
//     replay. Once the lease has run out, Acquire answers
//     [storage.Committed]: the middleware answers 409 ErrNotReplayable (or
//     WithRebuild's answer), and never runs the handler.
//   - Complete by the owner turns it into a done entry with the record (the
//     normal path, after the handler returns), even after the lease ran
//     out.
//   - Release by the owner does not delete it, and returns nil: the
//     application's change committed, so a retry must not run the handler
//     again, whatever the handler answered afterwards (an error status,
//     which the middleware does not store, or a panic). It ends the lease,
//     so that a retry gets ErrNotReplayable at once. An entry taken from
//     an issue is no exception: committed, it never becomes issued again.
//
// # The statements
//
// Every operation is one SQL statement, so one round trip once pgx has
// prepared it on the connection (pgx's default statement cache prepares a
// statement the first time a connection runs it: one round trip more,
// once), and atomic: a protected first execution costs two round trips
// (Acquire, Complete), and a replay one; a Fence is one statement more in
// the application's transaction. The statements also work in pgx's
// QueryExecModeExec and QueryExecModeSimpleProtocol, which prepare
// nothing, as a pool behind PgBouncer in transaction mode needs. Leases
// and TTLs are judged by the
// database's clock (clock_timestamp(), not now(), which is the
// transaction's start), never the application's, so the instances' clocks
// do not matter; durations are sent in milliseconds, rounded up.
//
// An Acquire that finds a done or committed row (a replay), or another
// owner's live processing row (in flight), answers from its snapshot,
// without a lock or a write: a storm of duplicates costs reads only.
// Otherwise (no row, an expired or issued one, or the caller's own: a
// resend) it is an INSERT ... ON CONFLICT DO UPDATE that locks the row of
// the key, whoever committed it and when. Its DO UPDATE always updates,
// which is what makes it return the row it locked (see acquireSQL in the
// source), so that an Acquire that loses a race for an expired or issued
// key to another owner writes one row version, unchanged. (The
// alternative, a DO UPDATE ... WHERE that writes nothing when the key is
// not free, returns no row then, and the SELECT that would have to find
// it reads the statement's snapshot, which misses a row committed by a
// concurrent Acquire meanwhile: such an Acquire would answer nothing.)
// AcquireIssued is the same, with an UPDATE of the key's live row instead
// of the INSERT, so that it creates nothing: it finds no row when the key
// was not issued. Issue is an INSERT ... ON CONFLICT DO UPDATE ... WHERE
// that replaces only an expired row.
//
// # Row locks
//
// A statement waiting on a row lock holds its pool connection meanwhile,
// and the requests that wait on an application's transaction could take
// every connection of a small pool. So no statement of the store waits
// for a transaction that Fence joined: Fence locks the row FOR UPDATE,
// and every other statement, before it writes the key's row, locks it
// FOR KEY SHARE SKIP LOCKED, the one mode that conflicts with FOR UPDATE
// only. A row held by a fenced transaction is skipped, and the statement
// answers at once from its snapshot, in one round trip (a Complete that
// found nothing to update takes a second one to tell a locked row from a
// lost one):
//
//   - Acquire and AcquireIssued: [storage.InFlight], with the fingerprint
//     of the execution that fenced and the lease left as the row showed
//     it before the Fence, at least 1 ms (the heartbeat cannot renew the
//     lease while the transaction is open, so once it has run out,
//     Retry-After is 1 s until the transaction ends);
//   - Issue: [storage.ErrExists];
//   - Extend, Complete and Release by the entry's owner: an error wrapping
//     [ErrLocked], having changed nothing; not [storage.ErrNotOwner], so
//     the middleware tries again (the heartbeat at its next renewal,
//     Complete and Release with backoff), and succeeds once the
//     transaction has ended. By another owner: what they answer anyway
//     (the row is not theirs).
//
// The store's own statements change no key column, so their row locks
// (FOR NO KEY UPDATE) do not conflict with FOR KEY SHARE: a statement
// still waits for the microseconds of another statement's write, and
// reads the row that write left, as the [storage.Store] contract needs.
// The exceptions, which answer as for a fenced row: a row that a DELETE
// (Release's, or the janitor's of an expired row) is deleting at that
// instant, which the lock also skips; and two Releases of one key at once
// by its owner (each waits for the other's FOR KEY SHARE lock, a deadlock
// that PostgreSQL ends after deadlock_timeout by failing one of them).
// A transaction of the application's that locks the table's rows other
// than through Fence is waited for, as is a Fence of a version of this
// package before these locks, during an upgrade.
//
// On a loopback server without fsync (2 cores, one goroutine,
// BenchmarkStore), a first execution's two statements take about 0.21 ms,
// a replay about 0.09 ms and a conflict about 0.11 ms; on a real server
// each write also waits for its commit to reach the disk.
//
// # Cost and tuning
//
// A row holds the key (22 bytes from the middleware), the owner token (32),
// the fingerprint (up to 255), the state, a timestamp and the encoded
// response; responses over about 2 kB are compressed and moved out of line
// (TOAST). Each execution inserts a row and updates it once (Complete),
// and the janitor deletes it after the TTL: the table churns, and its
// dead rows are autovacuum's work. For a busy table, lower
// autovacuum_vacuum_scale_factor for it (ALTER TABLE ... SET
// (autovacuum_vacuum_scale_factor = 0.01)). The index on expires makes
// every update a non-HOT update (PostgreSQL 15 and older); it is what lets
// the janitor find expired rows without reading the table.
//
// The janitor, one goroutine per Store, deletes expired rows every
// WithCleanupInterval in statements of at most WithCleanupBatch rows,
// skipping rows another transaction has locked (FOR UPDATE SKIP LOCKED):
// it never waits for a request, and a request waits for it at most as
// long as one row's deletion. Several instances' janitors share the work.
// [Store.Close] stops it; [Store.Cleanup] runs one round by hand.
//
// Do not make the table UNLOGGED: a crash of the server would empty it,
// and with it the proof that a committed change was made.
package pgstore
