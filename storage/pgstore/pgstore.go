package pgstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem/storage"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Defaults of the options.
const (
	// DefaultTable is the name of the table unless WithTable says
	// otherwise.
	DefaultTable = "idem_keys"
	// DefaultCleanupInterval is how often the janitor deletes expired rows
	// unless WithCleanupInterval says otherwise.
	DefaultCleanupInterval = time.Minute
	// DefaultCleanupBatch is the most rows one statement of the janitor
	// deletes unless WithCleanupBatch says otherwise.
	DefaultCleanupBatch = 1000
)

// ErrTableName is wrapped by the error of [New] and [Schema] for a table
// name that WithTable does not accept.
var ErrTableName = errors.New("pgstore: invalid table name")

// ErrLocked is wrapped by the error of Extend, Complete and Release by an
// entry's owner when its row is locked by a transaction under way that
// fenced it (see [Store.Fence], and Row locks in the package
// documentation): they answer at once instead of waiting for its end, and
// changed nothing. It is not [storage.ErrNotOwner]: the middleware tries
// again (the heartbeat at its next renewal; Complete and Release with
// backoff), and succeeds once the transaction has ended.
var ErrLocked = errors.New("pgstore: entry locked by a transaction under way")

// Store is a storage.Store on PostgreSQL. Create it with [New]; the zero
// value is not usable. It is safe for concurrent use.
type Store struct {
	pool  *pgxpool.Pool
	table string // as given, for messages
	sql   statements

	cleanupEvery time.Duration
	batch        int
	maxRecord    int

	stop    context.CancelFunc
	janitor sync.WaitGroup
	once    sync.Once
}

var (
	_ storage.Inspector = (*Store)(nil)
	_ storage.Store     = (*Store)(nil)
	_ storage.Issuer    = (*Store)(nil)
)

// Option configures a Store.
type Option func(*config)

type config struct {
	table        string
	cleanupEvery time.Duration
	batch        int
	maxRecord    int
	clock        string // SQL that reads the clock; tests only (export_test.go)
}

// DefaultMaxRecordBytes is the longest record Complete keeps unless
// WithMaxRecordBytes says otherwise: PostgreSQL's limit of 1 GB on one
// field, less 1 KiB for the rest of the statement.
const DefaultMaxRecordBytes = 1<<30 - 1024

// pgProgramLimitExceeded is the SQLSTATE of a value over a server limit.
const pgProgramLimitExceeded = "54000"

// WithMaxRecordBytes bounds the records Complete keeps to n bytes,
// [DefaultMaxRecordBytes] by default; n <= 0 or over the default keeps
// the default. A longer record is refused with an error wrapping
// [storage.ErrTooLarge], before anything is sent, and the middleware then
// keeps the key done but not replayable (409 ErrNotReplayable, no second
// run). The middleware's own WithMaxResponseBody (1 MiB by default) keeps
// records far smaller: this bounds the rows of a table that applications
// with other settings share.
func WithMaxRecordBytes(n int) Option {
	return func(c *config) {
		if n > 0 && n < DefaultMaxRecordBytes {
			c.maxRecord = n
		}
	}
}

// WithTable sets the table, [DefaultTable] by default: a name of lower-case
// ASCII letters, digits and underscores that does not start with a digit,
// of at most 51 bytes (so that the index's name, the table's and
// "_expires_idx", fits PostgreSQL's 63), optionally after a schema name of
// the same kind and a dot ("idem.keys"). Give each application sharing a
// database its own table, or its own schema.
func WithTable(name string) Option { return func(c *config) { c.table = name } }

// WithCleanupInterval sets how often the janitor deletes expired rows,
// [DefaultCleanupInterval] by default; d <= 0 keeps the default. An expired
// row is treated as absent at once whatever the interval; the janitor only
// frees its space.
func WithCleanupInterval(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.cleanupEvery = d
		}
	}
}

// WithCleanupBatch sets the most rows one statement of the janitor deletes,
// [DefaultCleanupBatch] by default; n <= 0 keeps the default. Smaller
// batches hold fewer row locks for less time; the janitor runs batches one
// after another until a batch finds fewer rows than n.
func WithCleanupBatch(n int) Option {
	return func(c *config) {
		if n > 0 {
			c.batch = n
		}
	}
}

// New returns a Store that keeps its entries in the table of pool's
// database (see WithTable), and starts its janitor goroutine; call Close to
// stop it. It sends nothing to the database: create the table with
// [Store.CreateTable], or with a migration of your own that runs
// [Schema]'s text. The pool stays the caller's: Close does not close it.
//
// It fails when pool is nil, and with an error wrapping [ErrTableName]
// when WithTable's name is not accepted.
func New(pool *pgxpool.Pool, opts ...Option) (*Store, error) {
	if pool == nil {
		return nil, errors.New("pgstore: nil pool")
	}
	c := config{table: DefaultTable, cleanupEvery: DefaultCleanupInterval, batch: DefaultCleanupBatch, maxRecord: DefaultMaxRecordBytes}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	id, err := parseTable(c.table)
	if err != nil {
		return nil, err
	}
	s := &Store{pool: pool, table: c.table, sql: newStatements(id, c.clock), cleanupEvery: c.cleanupEvery, batch: c.batch, maxRecord: c.maxRecord}
	ctx, stop := context.WithCancel(context.Background())
	s.stop = stop
	s.janitor.Add(1)
	go s.runJanitor(ctx)
	return s, nil
}

// Close stops the janitor goroutine, cancelling a cleanup under way, and
// waits for it to exit. It is idempotent, safe to call concurrently, and
// always returns nil. It does not close the pool. The store stays usable
// after Close; expired rows are then deleted only by [Store.Cleanup] or
// when a key is acquired again.
func (s *Store) Close() error {
	s.once.Do(s.stop)
	s.janitor.Wait()
	return nil
}

// Table returns the table's name, as given to WithTable.
func (s *Store) Table() string { return s.table }

//go:embed schema.sql
var schemaSQL string

// tableName is a valid name for WithTable, in parts.
var tableName = regexp.MustCompile(`^(?:([a-z_][a-z0-9_]{0,62})\.)?([a-z_][a-z0-9_]{0,50})$`)

// parseTable checks a name given to WithTable and returns it as an
// identifier.
func parseTable(name string) (pgx.Identifier, error) {
	m := tableName.FindStringSubmatch(name)
	if m == nil {
		return nil, fmt.Errorf("%w %q: want lower-case letters, digits and underscores, not starting with a digit, "+
			"at most 51 bytes, optionally after a schema name and a dot", ErrTableName, name)
	}
	if m[1] == "" {
		return pgx.Identifier{m[2]}, nil
	}
	return pgx.Identifier{m[1], m[2]}, nil
}

// Schema returns the SQL that creates the table name (as WithTable takes
// it; "" means [DefaultTable]) and its index when they do not exist: the
// text of the package's schema.sql with the name replaced. It is what
// [Store.CreateTable] runs, for teams that run their own migrations.
func Schema(name string) (string, error) {
	if name == "" {
		name = DefaultTable
	}
	id, err := parseTable(name)
	if err != nil {
		return "", err
	}
	return schemaFor(id), nil
}

// schemaFor writes schema.sql for table id: the index's name is the
// table's (without schema) and "_expires_idx", and the name of the CHECK
// on state (in a comment), the table's and "_state_check".
func schemaFor(id pgx.Identifier) string {
	const index, since, check = "idem_keys_expires_idx", "idem_keys_state_since_idx", "idem_keys_state_check"
	r := strings.NewReplacer(
		index, pgx.Identifier{id[len(id)-1] + "_expires_idx"}.Sanitize(),
		since, pgx.Identifier{id[len(id)-1] + "_state_since_idx"}.Sanitize(),
		check, pgx.Identifier{id[len(id)-1] + "_state_check"}.Sanitize(),
		"'"+DefaultTable+"'::regclass", "'"+strings.ReplaceAll(id.Sanitize(), "'", "''")+"'::regclass",
		DefaultTable, id.Sanitize(),
	)
	return r.Replace(schemaSQL)
}

// CreateTable creates the store's table and its index unless they exist,
// in one transaction that holds an advisory lock meanwhile, so that
// instances starting together do not trip over each other. In a table
// that exists it adds only what this version needs and a table made by an
// older one lacks: the since column and the index on (state, since), each
// only when missing (see schema.sql). The database user needs CREATE on
// the schema.
func (s *Store) CreateTable(ctx context.Context) error {
	// One simple-protocol query: its statements run in one implicit
	// transaction, whose lock ends with it.
	q := "SELECT pg_advisory_xact_lock(hashtext('github.com/idemkit/idem/storage/pgstore'));\n" + s.sql.schema
	if _, err := s.pool.Exec(ctx, q); err != nil {
		return fmt.Errorf("pgstore: creating table %s: %w", s.table, err)
	}
	return nil
}

// statements are the SQL of the store's operations on its table.
type statements struct {
	schema, acquire, acquireIssued, issue, complete, completeFailed, release, extend, fence, cleanup string
	lookup, remove, listState, listAll                                                               string
}

// newStatements writes the statements for table id. A clock other than ""
// replaces clock_timestamp(): tests move the clock of a table of theirs.
func newStatements(id pgx.Identifier, clock string) statements {
	r := strings.NewReplacer("{table}", id.Sanitize())
	if clock != "" {
		r = strings.NewReplacer("{table}", id.Sanitize(), "clock_timestamp()", clock)
	}
	f := r.Replace
	return statements{
		schema:         schemaFor(id),
		acquire:        f(acquireSQL),
		acquireIssued:  f(acquireIssuedSQL),
		issue:          f(issueSQL),
		complete:       f(completeSQL),
		completeFailed: f(completeFailedSQL),
		release:        f(releaseSQL),
		extend:         f(extendSQL),
		fence:          f(fenceSQL),
		cleanup:        f(cleanupSQL),
		lookup:         f(lookupSQL),
		remove:         f(removeSQL),
		listState:      f(listStateSQL),
		listAll:        f(listAllSQL),
	}
}

// The statements. Each is one statement, so one round trip once pgx has
// prepared it on the connection, and each is atomic. The clock is the
// database's: clock_timestamp(), the time when it is called (now() is the
// time the transaction started, which may be long before the row is
// locked). A row whose expires has come (expires <= the clock) is treated
// as absent by every statement. Parameters: $1 key, $2 owner, and then a
// fingerprint, a record, or a lease or TTL in whole milliseconds.
//
// # Row locks
//
// No statement waits for a transaction of the application's. Fence (the
// only statement that runs in one) locks the key's row FOR UPDATE, the
// only row-lock mode that conflicts with FOR KEY SHARE. Every other
// statement that writes a row first locks it with the probe
//
//	SELECT ... FOR KEY SHARE SKIP LOCKED
//
// in a CTE that runs before its write: the probe skips a row that a
// Fence's transaction holds (and one that a DELETE, which also locks FOR
// UPDATE, is deleting at that instant: Release's, or the janitor's), and
// the statement then answers at once, from its snapshot, without touching
// the row. The store's own writes are UPDATEs that change no key, which
// lock FOR NO KEY UPDATE: the probe does not conflict with them, so a
// statement still waits for the few microseconds of another statement's
// write and reads its result (the newest version, READ COMMITTED), as the
// contract needs (50 owners taking one issued key: one wins, and the 49
// others see its fingerprint). Once the probe holds its lock, no Fence
// can take the row until the statement ends. A statement that only
// reads, or that the snapshot answers (another owner's live row, a done
// or committed row), locks nothing.
//
// What a statement answers when its probe finds the row locked:
// Acquire and AcquireIssued, in flight ("locked" below); Issue, ErrExists;
// Extend, Complete and Release, [ErrLocked] when the snapshot's row is the
// caller's (its owner is the caller), and otherwise what they answer
// anyway (ErrNotOwner, or nil for a Release with nothing of the caller's):
// a row that another owner held when the statement started cannot be the
// caller's.
//
// The one wait left: Acquire and Issue of a key that has no row in their
// snapshot insert one, and an INSERT that finds a row committed since the
// snapshot locks it. That row would have to be acquired, its handler run
// and fenced within the statement's own few microseconds.

// acquireSQL: $3 fingerprint, $4 lease. It answers one row: state, mine
// (the caller holds the entry now), fingerprint, record, and the lease left
// in ms: of a processing or locked row, at least 1; of a committed row,
// that of the execution that committed (held_until), or 0 once it has
// ended.
//
// s is the key's row in the statement's snapshot. cur answers from it,
// without a lock or a write, when it is live and not to be taken: done or
// committed (such a row changes only by expiring or, committed, by
// becoming done), or processing and another owner's (in flight: true when
// the statement started; a duplicate writes nothing).
//
// Otherwise the row is to be taken (expired, issued, or the caller's own:
// a resend), or there is none. A row in the snapshot is locked by the
// probe lk first. If the probe skipped it (a Fence's transaction holds it,
// or it is being deleted), the answer is "locked": in flight, with the
// fingerprint of the snapshot's row and the lease it shows, at least 1 ms
// (once the lease the fence was taken with has run out while the
// transaction is still open, 1 ms: Retry-After 1 s).
//
// Otherwise ins runs: INSERT ... ON CONFLICT DO UPDATE, on the row lk
// holds, or on whatever row holds the key when the snapshot had none,
// including one that a concurrent transaction committed after the
// snapshot was taken. Its DO UPDATE has no WHERE: it always updates, so
// RETURNING always gives the row version it locked, even when nothing
// could be taken (a row taken by another owner between the snapshot and
// the lock, or inserted after the snapshot). (With a WHERE, a row not
// taken is not returned, and a SELECT beside it sees the statement's
// snapshot, which may not hold a row committed meanwhile: the answer
// would be empty.) The sub-select reads the clock once, after the row
// lock is held, and decides once whether the row is taken: it has expired
// (gone: it starts afresh, not issued), it is issued (it keeps
// issue_ttl), or it is processing and held by the same owner (a resend).
// Otherwise every column keeps its value.
const acquireSQL = `WITH s AS (
  SELECT e.state, e.owner, e.fingerprint, e.record, e.expires, e.held_until, e.expires > clock_timestamp() AS live
  FROM {table} e WHERE e.key = $1
), cur AS (
  SELECT s.state, s.fingerprint, s.record, CASE WHEN s.state = 'processing' THEN s.expires ELSE s.held_until END AS until
  FROM s WHERE s.live AND (s.state IN ('committed', 'done') OR (s.state = 'processing' AND s.owner <> $2::bytea))
), lk AS (
  SELECT e.key FROM {table} e
  WHERE e.key = $1 AND EXISTS (SELECT FROM s) AND NOT EXISTS (SELECT FROM cur)
  FOR KEY SHARE SKIP LOCKED
), ins AS (
  INSERT INTO {table} AS e (key, state, owner, fingerprint, expires, since)
  SELECT $1, 'processing', $2, $3, clock_timestamp() + $4::bigint * interval '1 millisecond', clock_timestamp()
  WHERE NOT EXISTS (SELECT FROM cur) AND (NOT EXISTS (SELECT FROM s) OR EXISTS (SELECT FROM lk))
  ON CONFLICT (key) DO UPDATE SET (state, owner, fingerprint, expires, held_until, record, issue_ttl, since) = (
    SELECT CASE WHEN x.take THEN 'processing' ELSE e.state END,
           CASE WHEN x.take THEN excluded.owner ELSE e.owner END,
           CASE WHEN x.take THEN excluded.fingerprint ELSE e.fingerprint END,
           CASE WHEN x.take THEN x.now + $4::bigint * interval '1 millisecond' ELSE e.expires END,
           CASE WHEN x.take THEN NULL ELSE e.held_until END,
           CASE WHEN x.take THEN NULL ELSE e.record END,
           CASE WHEN x.gone THEN NULL ELSE e.issue_ttl END,
           CASE WHEN x.gone OR e.state = 'issued' THEN x.now ELSE e.since END
    FROM (SELECT y.now, y.gone, y.gone OR e.state = 'issued' OR (e.state = 'processing' AND e.owner = excluded.owner) AS take
          FROM (SELECT c.now, e.expires <= c.now AS gone FROM (SELECT clock_timestamp() AS now) c) y) x)
  RETURNING e.state, e.owner = $2 AS mine, e.fingerprint, e.expires, e.held_until, e.record
), out AS (
  SELECT state, false AS mine, fingerprint, record, until FROM cur
  UNION ALL
  SELECT state, mine, fingerprint, record, CASE WHEN state = 'processing' THEN expires ELSE held_until END FROM ins
  UNION ALL
  SELECT 'locked', false, s.fingerprint, NULL, CASE WHEN s.state = 'processing' THEN s.expires END FROM s
  WHERE NOT EXISTS (SELECT FROM cur) AND NOT EXISTS (SELECT FROM lk)
)
SELECT state, mine, fingerprint, record,
       CASE WHEN state IN ('processing', 'locked')
              THEN greatest(coalesce(ceil(extract(epoch FROM until - clock_timestamp()) * 1000), 1), 1)
            WHEN until > clock_timestamp() THEN ceil(extract(epoch FROM until - clock_timestamp()) * 1000)
            ELSE 0 END::bigint
FROM out`

// acquireIssuedSQL: $3 fingerprint, $4 lease. It answers as acquireSQL
// does, or no row when the key has no live entry (not issued): it creates
// none.
//
// s, cur, lk and the locked answer are acquireSQL's (a row locked by a
// Fence's transaction is in flight, even once the snapshot shows its
// lease expired). Otherwise upd takes the row lock on the key's live row,
// if the snapshot holds one: lk holds it already; an UPDATE that waits
// for a concurrent writer re-checks its WHERE on the newest version of
// the row (READ COMMITTED), so a row taken, released or completed
// meanwhile is answered as it is now, and one deleted or expired
// meanwhile as not issued. Like acquireSQL's DO UPDATE, it always
// updates a live row, so that RETURNING gives it, and takes it when it is
// issued or processing and held by the same owner (a resend). A row
// inserted by a concurrent statement after the snapshot is not seen: the
// answer, not issued, was true when the statement started.
const acquireIssuedSQL = `WITH s AS (
  SELECT e.state, e.owner, e.fingerprint, e.record, e.expires, e.held_until, e.expires > clock_timestamp() AS live
  FROM {table} e WHERE e.key = $1
), cur AS (
  SELECT s.state, s.fingerprint, s.record, CASE WHEN s.state = 'processing' THEN s.expires ELSE s.held_until END AS until
  FROM s WHERE s.live AND (s.state IN ('committed', 'done') OR (s.state = 'processing' AND s.owner <> $2::bytea))
), lk AS (
  SELECT e.key FROM {table} e
  WHERE e.key = $1 AND EXISTS (SELECT FROM s) AND NOT EXISTS (SELECT FROM cur)
  FOR KEY SHARE SKIP LOCKED
), upd AS (
  UPDATE {table} e SET (state, owner, fingerprint, expires, since) = (
    SELECT CASE WHEN x.take THEN 'processing' ELSE e.state END,
           CASE WHEN x.take THEN $2::bytea ELSE e.owner END,
           CASE WHEN x.take THEN $3::bytea ELSE e.fingerprint END,
           CASE WHEN x.take THEN x.now + $4::bigint * interval '1 millisecond' ELSE e.expires END,
           CASE WHEN e.state = 'issued' THEN x.now ELSE e.since END
    FROM (SELECT c.now, e.state = 'issued' OR (e.state = 'processing' AND e.owner = $2::bytea) AS take
          FROM (SELECT clock_timestamp() AS now) c) x)
  WHERE e.key = $1 AND e.expires > clock_timestamp() AND NOT EXISTS (SELECT FROM cur) AND EXISTS (SELECT FROM lk)
  RETURNING e.state, e.owner = $2::bytea AS mine, e.fingerprint, e.expires, e.held_until, e.record
), out AS (
  SELECT state, false AS mine, fingerprint, record, until FROM cur
  UNION ALL
  SELECT state, mine, fingerprint, record, CASE WHEN state = 'processing' THEN expires ELSE held_until END FROM upd
  UNION ALL
  SELECT 'locked', false, s.fingerprint, NULL, CASE WHEN s.state = 'processing' THEN s.expires END FROM s
  WHERE NOT EXISTS (SELECT FROM cur) AND NOT EXISTS (SELECT FROM lk)
)
SELECT state, mine, fingerprint, record,
       CASE WHEN state IN ('processing', 'locked')
              THEN greatest(coalesce(ceil(extract(epoch FROM until - clock_timestamp()) * 1000), 1), 1)
            WHEN until > clock_timestamp() THEN ceil(extract(epoch FROM until - clock_timestamp()) * 1000)
            ELSE 0 END::bigint
FROM out`

// issueSQL: $2 TTL. One row affected: issued. A live row in the
// snapshot, in any state, is left as it is, unlocked: no row affected,
// ErrExists. Otherwise INSERT ... ON CONFLICT DO UPDATE takes the row lock
// on a row that holds the key (an expired row of the snapshot, which the
// probe lk holds already; or one committed since the snapshot), and
// replaces it only when it has expired (its WHERE is checked on the
// locked, newest version). An expired row that lk finds locked (a Fence's
// transaction that outlived its lease holds it, or it is being deleted) is
// in use: no row affected, ErrExists.
const issueSQL = `WITH s AS (
  SELECT e.expires > clock_timestamp() AS live FROM {table} e WHERE e.key = $1
), lk AS (
  SELECT e.key FROM {table} e WHERE e.key = $1 AND EXISTS (SELECT FROM s WHERE NOT s.live)
  FOR KEY SHARE SKIP LOCKED
)
INSERT INTO {table} AS e (key, state, owner, fingerprint, expires, issue_ttl, since)
SELECT $1, 'issued', ''::bytea, ''::bytea, clock_timestamp() + $2::bigint * interval '1 millisecond', $2::bigint, clock_timestamp()
WHERE NOT EXISTS (SELECT FROM s) OR EXISTS (SELECT FROM lk)
ON CONFLICT (key) DO UPDATE SET
  state = 'issued', owner = '', fingerprint = '', held_until = NULL, record = NULL,
  expires = clock_timestamp() + $2::bigint * interval '1 millisecond', issue_ttl = $2::bigint, since = clock_timestamp()
WHERE e.expires <= clock_timestamp()`

// completeSQL: $3 record, $4 TTL. One row updated means done (nil); none,
// that the owner's entry is gone, another's or done by another owner, or
// that it is locked: completeFailedSQL then tells which.
//
// The owner's processing or committed entry becomes done, and keeps its
// owner: the one that completed it. A done entry completed by this very
// owner with this very record is a resend and is rewritten unchanged (same
// record, same expiry: keeping e.record reuses its TOASTed value); a done
// entry of another owner is never one, even with an identical record (an
// execution whose lease ran out, while another owner took the key and
// completed it, is not that owner's resend). An UPDATE re-checks its
// WHERE on the newest version of a row changed concurrently (READ
// COMMITTED), so a resend racing the first Complete sees the done row.
// lk skips the row, and so nothing is updated, while a transaction that
// fenced it is open.
const completeSQL = `WITH lk AS (
  SELECT e.key FROM {table} e WHERE e.key = $1 AND e.owner = $2
  FOR KEY SHARE SKIP LOCKED
)
UPDATE {table} e SET
    state = 'done',
    held_until = NULL,
    issue_ttl = NULL,
    record = CASE WHEN e.state = 'done' THEN e.record ELSE $3 END,
    since = CASE WHEN e.state = 'done' THEN e.since ELSE clock_timestamp() END,
    expires = CASE WHEN e.state = 'done' THEN e.expires ELSE clock_timestamp() + $4::bigint * interval '1 millisecond' END
  WHERE e.key = $1 AND e.expires > clock_timestamp() AND e.owner = $2
    AND (e.state IN ('processing', 'committed') OR (e.state = 'done' AND e.record = $3))
    AND EXISTS (SELECT FROM lk)`

// completeFailedSQL tells, after a completeSQL that updated nothing,
// whether the caller may try again (ErrLocked) rather than having lost
// the entry (ErrNotOwner): the owner's row is locked by a transaction
// that fenced it, or it is (by now) one completeSQL would take. Only a
// Complete that failed pays this second round trip.
const completeFailedSQL = `WITH s AS (
  SELECT e.state, e.expires > clock_timestamp() AS live, e.record = $3 AS same
  FROM {table} e WHERE e.key = $1 AND e.owner = $2
), lk AS (
  SELECT e.key FROM {table} e WHERE e.key = $1 AND e.owner = $2
  FOR KEY SHARE SKIP LOCKED
)
SELECT EXISTS (SELECT FROM s WHERE s.live AND (s.state IN ('processing', 'committed') OR (s.state = 'done' AND s.same)))
    OR (EXISTS (SELECT FROM s) AND NOT EXISTS (SELECT FROM lk))`

// releaseSQL answers two booleans: ok, true when nothing of the caller is
// held by anyone else (nil), false for ErrNotOwner; and locked (ErrLocked:
// the snapshot's row is the caller's, and lk finds it locked).
//
// del deletes the owner's processing row (expired or not), unless it was
// taken from an issue and is live: back makes that one issued again, for
// the issue's TTL from now. (An expired one is spent: deleted. A row that
// expires between the two checks could match both, and only one of the
// two changes it: either is a true answer at that instant.) A committed
// row is never deleted: its transaction committed the application's
// change; unheld ends the lease of the owner's committed row instead, so
// that a retry is answered at once (the response will not be stored), not
// after the lease. del and back never touch the committed row, nor unheld
// a processing one: their states differ. The check reads the snapshot: a
// live row that is neither issued nor the owner's processing or committed
// row means ErrNotOwner. When del or back found the owner's row changed
// meanwhile (taken by another owner after its lease, or committed by the
// owner's Fence), the snapshot still shows the owner's processing row and
// the answer is nil, true of the time the statement started. A row
// inserted by another owner during the statement is not seen either:
// nothing of the caller's was held, nil again. (del's DELETE needs a lock
// stronger than lk's: two Releases of one key at once by its owner would
// each wait for the other's lk, a deadlock that PostgreSQL breaks after
// deadlock_timeout by failing one of them, which the middleware retries.)
const releaseSQL = `WITH s AS (
  SELECT FROM {table} e WHERE e.key = $1 AND e.owner = $2
), lk AS (
  SELECT e.key FROM {table} e WHERE e.key = $1 AND EXISTS (SELECT FROM s)
  FOR KEY SHARE SKIP LOCKED
), del AS (
  DELETE FROM {table} e WHERE e.key = $1 AND e.owner = $2 AND e.state = 'processing'
    AND (e.issue_ttl IS NULL OR e.expires <= clock_timestamp()) AND EXISTS (SELECT FROM lk)
  RETURNING 1
), back AS (
  UPDATE {table} e SET state = 'issued', owner = '', fingerprint = '', since = clock_timestamp(),
    expires = clock_timestamp() + e.issue_ttl * interval '1 millisecond'
  WHERE e.key = $1 AND e.owner = $2 AND e.state = 'processing'
    AND e.issue_ttl IS NOT NULL AND e.expires > clock_timestamp() AND EXISTS (SELECT FROM lk)
  RETURNING 1
), unheld AS (
  UPDATE {table} e SET held_until = NULL WHERE e.key = $1 AND e.owner = $2 AND e.state = 'committed'
    AND EXISTS (SELECT FROM lk)
  RETURNING 1
)
SELECT EXISTS (SELECT FROM del) OR EXISTS (SELECT FROM back) OR EXISTS (SELECT FROM unheld) OR NOT EXISTS (
  SELECT FROM {table} e WHERE e.key = $1 AND e.expires > clock_timestamp() AND e.state <> 'issued'
    AND NOT (e.owner = $2 AND e.state IN ('processing', 'committed'))),
  EXISTS (SELECT FROM s) AND NOT EXISTS (SELECT FROM lk)`

// extendSQL: $3 lease. It answers two booleans: extended (nil), and
// locked (ErrLocked: the snapshot's row is the caller's, and lk finds it
// locked, as while the owner's own fenced transaction is open); neither
// is ErrNotOwner. A processing row's expiry is its lease; a committed
// row's expiry is its TTL's, and stays, while the lease of the execution
// that committed it, held_until, is extended unless it has ended (it ran
// out, or the owner's Release ended it): like a processing row's, a lease
// that has run out stays so.
const extendSQL = `WITH s AS (
  SELECT FROM {table} e WHERE e.key = $1 AND e.owner = $2
), lk AS (
  SELECT e.key FROM {table} e WHERE e.key = $1 AND EXISTS (SELECT FROM s)
  FOR KEY SHARE SKIP LOCKED
), upd AS (
  UPDATE {table} e SET
    expires = CASE WHEN e.state = 'processing' THEN clock_timestamp() + $3::bigint * interval '1 millisecond' ELSE e.expires END,
    held_until = CASE WHEN e.state = 'committed' AND e.held_until > clock_timestamp()
      THEN clock_timestamp() + $3::bigint * interval '1 millisecond' ELSE e.held_until END
  WHERE e.key = $1 AND e.owner = $2 AND e.state IN ('processing', 'committed') AND e.expires > clock_timestamp()
    AND EXISTS (SELECT FROM lk)
  RETURNING 1
)
SELECT EXISTS (SELECT FROM upd), EXISTS (SELECT FROM s) AND NOT EXISTS (SELECT FROM lk)`

// fenceSQL: $3 TTL. One row affected: the caller's transaction holds the
// row lock and the entry is committed in it, held until the end of the
// lease (SET reads the row as it was). An entry taken from an issue
// forgets it: committed, it is never issued again. l locks the row FOR
// UPDATE first (re-checking its WHERE on the newest version), so that the
// probes of the other statements skip it while the transaction is open
// (the UPDATE alone would lock FOR NO KEY UPDATE, which they do not see).
const fenceSQL = `WITH l AS (
  SELECT e.key FROM {table} e
  WHERE e.key = $1 AND e.owner = $2 AND e.state IN ('processing', 'committed') AND e.expires > clock_timestamp()
  FOR UPDATE
)
UPDATE {table} e SET
  state = 'committed',
  issue_ttl = NULL,
  held_until = CASE WHEN e.state = 'processing' THEN e.expires ELSE e.held_until END,
  expires = clock_timestamp() + $3::bigint * interval '1 millisecond'
WHERE e.key = $1 AND e.owner = $2 AND e.state IN ('processing', 'committed') AND e.expires > clock_timestamp()
  AND EXISTS (SELECT FROM l)`

// cleanupSQL: $1 batch size. It deletes at most $1 expired rows, found
// through the index on expires, skipping rows that another transaction
// has locked (an Acquire taking an expired row, a Fence), so it never
// waits for them and no request waits for it longer than the deletion of
// one row. FOR UPDATE re-checks the expiry on a row changed since the
// snapshot; the DELETE checks it again.
const cleanupSQL = `DELETE FROM {table} WHERE ctid IN (
  SELECT ctid FROM {table} WHERE expires <= clock_timestamp()
  ORDER BY expires LIMIT $1 FOR UPDATE SKIP LOCKED
) AND expires <= clock_timestamp()`

// ms gives d in whole milliseconds, rounded up, for a d > 0.
func ms(d time.Duration) int64 {
	n := int64(d / time.Millisecond)
	if d%time.Millisecond != 0 {
		n++
	}
	return n
}

// bytes returns s as a non-nil []byte: pgx sends a nil slice as NULL.
func bytes(s string) []byte {
	if s == "" {
		return []byte{}
	}
	return []byte(s)
}

// Acquire implements [storage.Store.Acquire]. A committed entry (see
// [Store.Fence]) is in flight while the lease of the execution that
// committed it runs (it may still store its response: the middleware
// answers 409 with Retry-After, or waits), and then [storage.Committed]
// (the response is lost: 409 ErrNotReplayable, or WithRebuild's answer). While the transaction that fenced the entry is open, the entry
// is in flight, answered at once (see Row locks in the package
// documentation). Given an issued entry, it takes it as AcquireIssued
// does. Errors wrap [storage.ErrInvalid], or say that the database could
// not be reached or failed.
func (s *Store) Acquire(ctx context.Context, key, owner, fingerprint string, lease time.Duration) (storage.Result, error) {
	if err := storage.CheckAcquire(key, owner, fingerprint, lease); err != nil {
		return storage.Result{}, fmt.Errorf("pgstore: acquire: %w", err)
	}
	res, err := s.acquire(ctx, s.sql.acquire, key, owner, fingerprint, lease)
	if err != nil {
		return storage.Result{}, fmt.Errorf("pgstore: acquire: %w", err)
	}
	return res, nil
}

// acquire runs the statement q, acquireSQL or acquireIssuedSQL, and maps
// the row it answers. Its error is pgx.ErrNoRows when there is none.
func (s *Store) acquire(ctx context.Context, q, key, owner, fingerprint string, lease time.Duration) (storage.Result, error) {
	var (
		state  string
		mine   bool
		fp     []byte
		record []byte
		left   int64
	)
	err := s.pool.QueryRow(ctx, q, bytes(key), bytes(owner), bytes(fingerprint), ms(lease)).
		Scan(&state, &mine, &fp, &record, &left)
	if err != nil {
		return storage.Result{}, err
	}
	switch {
	case state == "processing" && mine:
		return storage.Result{State: storage.Acquired}, nil
	case state == "processing", state == "locked":
		return storage.Result{State: storage.InFlight, Fingerprint: string(fp), LeaseLeft: time.Duration(left) * time.Millisecond}, nil
	case state == "committed" && left > 0:
		return storage.Result{State: storage.InFlight, Fingerprint: string(fp), LeaseLeft: time.Duration(left) * time.Millisecond}, nil
	case state == "committed":
		return storage.Result{State: storage.Committed, Fingerprint: string(fp)}, nil
	case state == "done" && record != nil:
		return storage.Result{State: storage.Done, Fingerprint: string(fp), Record: record}, nil
	}
	return storage.Result{}, fmt.Errorf("unexpected row: state %q", state)
}

// AcquireIssued implements [storage.Issuer.AcquireIssued]. A committed
// entry, and one whose fenced transaction is open, is answered as Acquire
// answers it. Errors wrap
// [storage.ErrInvalid], or say that the database could not be reached or
// failed.
func (s *Store) AcquireIssued(ctx context.Context, key, owner, fingerprint string, lease time.Duration) (storage.Result, error) {
	if err := storage.CheckAcquire(key, owner, fingerprint, lease); err != nil {
		return storage.Result{}, fmt.Errorf("pgstore: acquire issued: %w", err)
	}
	res, err := s.acquire(ctx, s.sql.acquireIssued, key, owner, fingerprint, lease)
	if errors.Is(err, pgx.ErrNoRows) {
		return storage.Result{State: storage.NotIssued}, nil
	}
	if err != nil {
		return storage.Result{}, fmt.Errorf("pgstore: acquire issued: %w", err)
	}
	return res, nil
}

// Issue implements [storage.Issuer.Issue]: it inserts an issued row, or
// replaces an expired row of any state. A row whose fenced transaction is
// open is in use: ErrExists, at once. Errors wrap [storage.ErrExists] or
// [storage.ErrInvalid], or say that the database could not be reached or
// failed.
func (s *Store) Issue(ctx context.Context, key string, ttl time.Duration) error {
	switch {
	case key == "":
		return fmt.Errorf("pgstore: issue: %w: empty key", storage.ErrInvalid)
	case ttl <= 0:
		return fmt.Errorf("pgstore: issue: %w: ttl %v", storage.ErrInvalid, ttl)
	}
	tag, err := s.pool.Exec(ctx, s.sql.issue, bytes(key), ms(ttl))
	if err != nil {
		return fmt.Errorf("pgstore: issue: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pgstore: issue: %w", storage.ErrExists)
	}
	return nil
}

// Complete implements [storage.Store.Complete]. It also completes the
// owner's committed entry (see [Store.Fence]). A done entry keeps the
// owner that completed it: a Complete of it is a resend (nil) only with
// that owner and the same record; by another owner, even with an
// identical record, it is ErrNotOwner. When a transaction that fenced the
// owner's entry is still open, it returns at once an error wrapping
// [ErrLocked], having changed nothing (the middleware tries again). A
// record longer than [WithMaxRecordBytes] allows, or one the server
// refuses for its size (SQLSTATE 54000), is [storage.ErrTooLarge], and
// changes nothing. Errors wrap [storage.ErrNotOwner], [ErrLocked],
// [storage.ErrTooLarge] or [storage.ErrInvalid], or say that the database
// could not be reached or failed.
func (s *Store) Complete(ctx context.Context, key, owner string, record []byte, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("pgstore: complete: %w: ttl %v", storage.ErrInvalid, ttl)
	}
	if record == nil {
		record = []byte{}
	}
	if len(record) > s.maxRecord {
		return fmt.Errorf("pgstore: complete: %w: %d bytes, at most %d", storage.ErrTooLarge, len(record), s.maxRecord)
	}
	tag, err := s.pool.Exec(ctx, s.sql.complete, bytes(key), bytes(owner), record, ms(ttl))
	if err != nil {
		if pe := (*pgconn.PgError)(nil); errors.As(err, &pe) && pe.Code == pgProgramLimitExceeded {
			return fmt.Errorf("pgstore: complete: %w: %w", storage.ErrTooLarge, err)
		}
		return fmt.Errorf("pgstore: complete: %w", err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	var locked bool
	if err := s.pool.QueryRow(ctx, s.sql.completeFailed, bytes(key), bytes(owner), record).Scan(&locked); err != nil {
		return fmt.Errorf("pgstore: complete: %w", err)
	}
	return answer("complete", false, locked)
}

// answer is the error of Complete, Release or Extend (op) from the two
// booleans of its statement. Locked comes first: Release's check may
// find nothing of the caller's held by anyone else (the snapshot's row is
// the caller's) when it could not touch the row, and a Release that did
// nothing must be tried again.
func answer(op string, ok, locked bool) error {
	switch {
	case locked:
		return fmt.Errorf("pgstore: %s: %w", op, ErrLocked)
	case ok:
		return nil
	}
	return fmt.Errorf("pgstore: %s: %w", op, storage.ErrNotOwner)
}

// Release implements [storage.Store.Release], with one exception: the
// owner's committed entry (see [Store.Fence]) is not deleted; its lease
// ends (a retry gets ErrNotReplayable at once), and Release returns nil.
// An entry taken from an issue becomes issued again, for the issue's
// whole TTL, unless it was committed. When a transaction that fenced the
// owner's entry is still open, it returns at once an error wrapping
// [ErrLocked], having changed nothing (the middleware tries again). Errors
// wrap [storage.ErrNotOwner] or [ErrLocked], or say that the database
// could not be reached or failed.
func (s *Store) Release(ctx context.Context, key, owner string) error {
	var ok, locked bool
	if err := s.pool.QueryRow(ctx, s.sql.release, bytes(key), bytes(owner)).Scan(&ok, &locked); err != nil {
		return fmt.Errorf("pgstore: release: %w", err)
	}
	return answer("release", ok, locked)
}

// Extend implements [storage.Store.Extend]. On the owner's committed entry
// (see [Store.Fence]) it extends the lease during which the entry is in
// flight, not the entry's expiry (its TTL's). While the transaction that
// fenced the owner's entry is open, it returns at once an error wrapping
// [ErrLocked], not ErrNotOwner, having changed nothing: the heartbeat
// tries again at its next renewal. Errors wrap [storage.ErrNotOwner],
// [ErrLocked] or [storage.ErrInvalid], or say that the database could not
// be reached or failed.
func (s *Store) Extend(ctx context.Context, key, owner string, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("pgstore: extend: %w: lease %v", storage.ErrInvalid, lease)
	}
	var extended, locked bool
	if err := s.pool.QueryRow(ctx, s.sql.extend, bytes(key), bytes(owner), ms(lease)).Scan(&extended, &locked); err != nil {
		return fmt.Errorf("pgstore: extend: %w", err)
	}
	return answer("extend", extended, locked)
}

// Cleanup deletes the expired rows of the table, in statements of at most
// WithCleanupBatch rows each, one after another until one deletes fewer,
// and returns how many it deleted. It skips rows locked by a transaction
// under way. The janitor calls it; so may a scheduler of your own. It
// stops at the first error, such as the end of ctx, and returns it with
// the count so far.
func (s *Store) Cleanup(ctx context.Context) (int64, error) {
	var total int64
	for {
		tag, err := s.pool.Exec(ctx, s.sql.cleanup, s.batch)
		if err != nil {
			return total, fmt.Errorf("pgstore: cleanup: %w", err)
		}
		n := tag.RowsAffected()
		total += n
		if n < int64(s.batch) {
			return total, nil
		}
	}
}

// runJanitor runs Cleanup every cleanupEvery until ctx ends, each run
// bounded by the interval. Its errors are dropped: expired rows are absent
// for every operation anyway, and the next run tries again.
func (s *Store) runJanitor(ctx context.Context) {
	defer s.janitor.Done()
	t := time.NewTicker(s.cleanupEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			run, cancel := context.WithTimeout(ctx, s.cleanupEvery)
			s.Cleanup(run)
			cancel()
		}
	}
}
