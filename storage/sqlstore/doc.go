// Package sqlstore is a storage.Store on database/sql, shared by every
// instance of a service, with a dialect per database family: [MySQL], for
// MySQL 8.0+ and MariaDB 10.6+ (InnoDB), and [PostgreSQL], for
// PostgreSQL 12+. It implements [storage.Store], [storage.Issuer] and
// [storage.Inspector] exactly as storage/pgstore does, with committed
// entries: [Store.Fence] joins the application's own transaction (a
// *sql.Tx on the same database) to the request's entry, so that the
// application's change and the entry commit together or not at all, and a
// retry never runs the work again. The package imports only database/sql
// and the kit's core; bring your driver (github.com/go-sql-driver/mysql is
// the one tested on MySQL; on PostgreSQL, github.com/jackc/pgx/v5/stdlib
// and github.com/lib/pq are, see [PostgreSQL]).
//
//	db, _ := sql.Open("mysql", "app:secret@tcp(db:3306)/app")
//	store, err := sqlstore.New(db, sqlstore.MySQL)
//	// or: db, _ := sql.Open("pgx", "postgres://app:secret@db/app")
//	//     store, err := sqlstore.New(db, sqlstore.PostgreSQL)
//	...
//	err = store.CreateTable(ctx) // or run sqlstore.Schema(dialect, "") in a migration
//	m, err := idem.New(store)
//
// and in a handler:
//
//	tx, _ := db.BeginTx(r.Context(), nil)
//	defer tx.Rollback()
//	... the order's INSERT ...
//	if err := store.Fence(r.Context(), tx); err != nil { return err } // last, before COMMIT
//	err = tx.Commit()
//
// The dialect is an opaque value: the store's logic is the dialect's
// statements run in the order described below, the same on every
// database. On PostgreSQL, storage/pgstore (on pgx's native interface)
// does the same work in fewer round trips, with one statement per
// operation; this package is for applications whose transactions are
// database/sql's.
//
// # The table
//
// One row per entry (see schema_mysql.sql and schema_postgres.sql,
// [Schema]): the key, state
// (issued, processing, committed, done), owner, fingerprint, times, the
// record. Keys, owners and fingerprints are VARBINARY(255): compared byte
// for byte, so "Key" and "key" (and "key ") are different entries, which
// a utf8mb4 collation would fold together (or pad). Times are BIGINT
// microseconds since the Unix epoch, read from the server's clock with
// UTC_TIMESTAMP(6): every instance judges leases by one clock, and no
// session time zone, DST change, or driver setting (parseTime, loc)
// changes what a stored time means. (DATETIME with NOW(6) would depend on
// each session's time_zone; TIMESTAMP on it too, and ends in 2038.) On
// PostgreSQL the same columns are bytea and bigint, and the clock is
// statement_timestamp() (see PostgreSQL below).
//
// # Statements and round trips
//
// MySQL has no RETURNING (MariaDB has INSERT ... RETURNING, MySQL does
// not) and no data-modifying CTE, so one atomic statement cannot both
// decide and answer, as pgstore's do. Each operation is a few autocommit
// statements, each atomic on one row by its primary key, and the WHERE of
// each write checks again what the read before it found; an UPDATE that
// finds the row changed affects no row and the operation reads again.
// Every UPDATE also bumps a rev column, because MySQL reports rows
// changed, not rows matched, and a write that sets the values already
// there would otherwise look like a lost race. Statements are prepared
// once per connection (database/sql's *sql.Stmt), then cost one round
// trip each. Counted in TestRoundTrips:
//
//   - first execution: Acquire 2 (a plain read, an INSERT); Complete 2 (a
//     locking read with NOWAIT, an UPDATE); Fence 1 in the application's
//     transaction (beside its BEGIN and COMMIT)
//   - replay (done): Acquire 1, the plain read, which carries the record
//   - conflict (in flight, committed): Acquire 1, the plain read
//   - Extend 2, Release 2, Issue 2, Lookup 1, List 1, Remove 2
//   - taking an expired row, or a resend by the owner: 3 (read, probe,
//     UPDATE); an issued one: 2 (read, UPDATE)
//
// The counts are the same on PostgreSQL (TestRoundTrips runs on MySQL and
// on PostgreSQL through pgx's database/sql driver and lib/pq, which
// prepare a statement in one round trip and run it in one). pgstore does a first execution
// in 2 round trips and a Fence in 1; this store needs 4 and 1.
//
// # Row locks
//
// Fence's UPDATE holds the row's exclusive lock until the application's
// transaction ends. No statement of the store waits for that lock (an
// InnoDB lock wait lasts innodb_lock_wait_timeout, 50 s by default, with a
// pool connection held meanwhile):
//
//   - Acquire reads the row without a lock (a consistent read, which sees
//     the row as it was before the Fence: the owner's processing row),
//     and answers at once when it is live and not to be taken: in flight
//     (409), done, committed.
//   - A row to be taken that a Fence may hold (expired, or the caller's
//     own) and every owner's operation (Complete, Extend, Release) and
//     Remove first lock it with SELECT ... FOR UPDATE NOWAIT, which fails
//     at once on a locked row (error 3572 on MySQL, 1205 on MariaDB,
//     SQLSTATE 55P03 on PostgreSQL): the
//     owner's operations answer [ErrLocked] (the middleware tries again),
//     Acquire reads the row again a few times, some milliseconds apart (a
//     lock held by another statement of the store lasts one statement)
//     and then answers in flight with 1 ms left.
//   - Taking an issued row, which no Fence can hold, is a plain UPDATE:
//     50 requests taking one issued key queue for a statement's time each,
//     and the 49 others then read the winner's row.
//   - The janitor reads expired keys without a lock and deletes each after
//     a NOWAIT lock (see [Store.Cleanup]; SKIP LOCKED is avoided: see
//     below).
//
// The one wait left, as in pgstore: between an operation's read and its
// write, another request could take the row and fence it, within a few
// microseconds; the write then waits for that transaction.
//
// # MySQL and MariaDB traps, and what the store does
//
//   - Gap and next-key locks under REPEATABLE READ (the default): a
//     locking read of a missing row locks the gap, and two transactions
//     inserting into it deadlock. The store takes no lock on a missing
//     row inside a transaction: its writes are autocommit statements on
//     one primary key, and an INSERT that finds the key taken fails with
//     a duplicate key error (1062) and reads the row instead. A Fence that
//     fails under REPEATABLE READ keeps its lock (on the row, or the gap)
//     until the application rolls back: roll back at once.
//   - Deadlocks (1213) need a third party (an application's transaction on
//     the table); a statement chosen as the victim changed nothing and is
//     run again, at most 3 times in all. TestDeadlockRetried provokes one
//     (two Acquire whose INSERTs queue behind an application's
//     uncommitted row of the same key, which then rolls back: InnoDB
//     kills one of the two), and TestChurn runs every operation on three
//     keys from 12 goroutines: no 1213 or 1205 reaches a caller.
//   - Lock waits (1205 after innodb_lock_wait_timeout): see Row locks; the
//     tests measure the answers during an open fenced transaction with
//     the server's timeout left at 50 s.
//   - SKIP LOCKED did not skip a row that a Fence's open transaction had
//     updated (an implicit lock) when read through the primary key with an
//     IN list on MariaDB 10.11, and the janitor's DELETE then waited for
//     it (seen in TestCleanupBatches, not reduced to a smaller case; a
//     transaction of the mariadb client's updating a row was skipped):
//     the janitor locks row by row with NOWAIT instead, which sees it.
//   - Server time vs client time: see The table.
//   - max_allowed_packet bounds a statement, and so a stored response. A
//     statement over it makes the server answer 1153 and close the
//     connection. Complete reads the server's max_allowed_packet once and
//     refuses a record that does not fit (less 1 KiB) with
//     [ErrRecordTooLarge], changing nothing; the middleware then keeps
//     the key done but not replayable (409 ErrNotReplayable, no second
//     run). Keep the middleware's largest record (WithMaxResponseBody,
//     1 MiB by default, plus headers) below it, so that responses replay
//     (16 MiB on MariaDB's default, 64 MiB on MySQL 8's; the smallest a
//     server may set is 1 KiB, so a lowered one matters).
//   - sql_mode: the store writes nothing a lax mode would truncate (keys
//     and owners over 255 bytes are [storage.ErrInvalid], fingerprints are
//     bounded by the contract), so it works in strict mode and without it
//     (TestContractSessionSettings runs the contract suite with sql_mode
//     set to the empty string and a time zone of +09:30).
//   - Assignment order: MySQL's and MariaDB's UPDATE evaluates SET left to
//     right, each assignment seeing those before it; the statements assign
//     the columns that read the old row first, so they mean the same under
//     MariaDB's SIMULTANEOUS_ASSIGNMENT sql_mode, where each sees the old
//     row.
//   - Autocommit: the store's statements rely on it; do not turn it off in
//     the DSN. Fence works in a transaction of any isolation level (an
//     UPDATE reads the newest committed row).
//   - Prepared statements: about 20 per connection of the pool count
//     towards the server's max_prepared_stmt_count (16382 by default).
//     A Fence prepares only on its transaction's connection, so that a
//     pool at its limit cannot stall it.
//
// # PostgreSQL
//
// [PostgreSQL] runs the same statements, in the same order, written for
// PostgreSQL 12+: $1-style parameters, bytea keys, owners, fingerprints
// and records (compared byte for byte, whatever the database's collation;
// NUL bytes are keys like any other), bigint microseconds, and the same
// NOWAIT probes (55P03 is "locked"). What differs, and the traps found:
//
//   - The clock is statement_timestamp(): one value for the whole
//     statement, as UTC_TIMESTAMP(6) on MySQL, and the statement's own
//     time. Not now(), which is the start of the transaction: a Fence in
//     a transaction begun while the lease ran would pass after the lease
//     had run out (TestPostgresFenceStatementClock); not clock_timestamp()
//     as such (pgstore's clock), which moves between the calls of one
//     statement, so that the WHERE and the SET of one UPDATE could
//     disagree; pgstore pins it once per statement in a subquery, which
//     statement_timestamp() does by itself. The number is an instant: no
//     TimeZone setting changes it (TestPostgresSessionSettings).
//   - Parameter types are inferred: "$1 * 1000" makes $1 an integer, and a
//     TTL over 24.8 days in milliseconds (or a MinAge over 35 minutes in
//     microseconds) would not fit. Every numeric parameter is cast to
//     bigint (TestPostgresLongDurations).
//   - Isolation: PostgreSQL's UPDATE under REPEATABLE READ or
//     SERIALIZABLE fails with a serialization failure (40001) on a row
//     changed since the transaction's snapshot, where InnoDB reads the
//     newest row. A Fence late in such a transaction, after the
//     heartbeat's Extend renewed the lease, fails so
//     (TestPostgresFenceRepeatableRead): fence first in such
//     transactions, and run them again on 40001, as they must anyway.
//     The store's own autocommit statements need READ COMMITTED,
//     PostgreSQL's default: a default_transaction_isolation of repeatable
//     read or serializable for the store's sessions (postgresql.conf,
//     ALTER DATABASE or ROLE ... SET, the DSN's options) makes concurrent
//     statements on one key fail with 40001, which the store runs again
//     at most twice (as a MySQL deadlock, 1213; 40P01 too); the
//     sequential contract holds (TestPostgresSerializableDefault), under
//     load callers would see 40001. Give the store a pool of its own with
//     options=-c default_transaction_isolation=read\ committed if the
//     database's default is another.
//   - A failed statement in a transaction aborts it (25P02 for every
//     statement after): roll back after a Fence that returned an error
//     (ErrNotOwner does not abort it, a database error does).
//   - CREATE TABLE IF NOT EXISTS and CREATE INDEX IF NOT EXISTS are not
//     safe from two sessions at once (a unique violation on the catalog):
//     CreateTable takes an advisory lock first, in the same implicit
//     transaction (TestPostgresCreateTableConcurrent). Schema's text has
//     three statements: run it as one script (the simple query protocol,
//     as database/sql's Exec without arguments does with both drivers).
//   - Identifiers longer than 63 bytes are truncated with a notice only:
//     WithTable refuses a schema name over 63 bytes (the table's is at
//     most 51 anyway). Names are quoted, so reserved words ("user",
//     "order") are tables like others (TestPostgresSchema).
//   - No max_allowed_packet: one field holds at most 1 GB, so a record
//     over 1 GB less 1 KiB is [ErrRecordTooLarge] before anything is
//     sent; drivers that send bytea as hex text (lib/pq) double it on the
//     wire, and the server's memory bounds it long before: keep records
//     far smaller (the middleware's WithMaxResponseBody).
//   - Prepared statements: the store prepares its statements on each
//     connection (database/sql's *sql.Stmt). Behind PgBouncer in
//     transaction pooling mode, use PgBouncer 1.21+ with
//     max_prepared_statements set, or session pooling.
//   - The UPDATE reports the rows it matched, not changed: no rev column
//     is needed, and the table has none.
//   - bytea_output (hex or escape) changes bytea's text form: pgx reads
//     bytea in binary and lib/pq parses either form, and the statements
//     compare the record's hash as hex text of their own, so keys,
//     fingerprints and records read back byte for byte
//     (TestPostgresByteaOutputEscape).
//   - pgstore's table is another table: its times are timestamptz, and
//     its default name is idem_keys too. On a database where pgstore made
//     idem_keys, CreateTable does nothing and every statement fails
//     (TestPostgresPgstoreTable): give this store another table
//     (WithTable). Moving from one store to the other is a new table.
//   - The janitor locks row by row with NOWAIT, as on MySQL (the
//     MariaDB trap does not apply, but FOR UPDATE SKIP LOCKED would answer
//     a row a Fence holds as no row, which the store cannot tell from a
//     row deleted meanwhile, and its DELETE would then wait for the
//     Fence); TestCleanupBatches and TestFenceOpenPastLease show it skips
//     such a row at once.
//   - A NOWAIT probe or an INSERT that finds its key taken fails its own
//     autocommit statement only; lock_timeout, if set for the store's
//     sessions, also answers 55P03, read as "locked".
//
// Drivers: the dialect finds the SQLSTATE of an error through
// errors.As to interface{ SQLState() string }, which
// github.com/jackc/pgx/v5/stdlib's *pgconn.PgError and
// github.com/lib/pq's *pq.Error both have. The tests run every shared
// test (the contract, Fence, round trips, binary keys, cleanup, churn)
// and the PostgreSQL ones through both drivers (pgx v5.12, lib/pq
// v1.12), with the same round trips on each.
package sqlstore
