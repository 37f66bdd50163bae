package sqlstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	_ "embed"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"time"

	"github.com/idemkit/idem/storage"
)

// Defaults of the options.
const (
	// DefaultTable is the name of the table unless WithTable says
	// otherwise.
	DefaultTable = "idem_keys"
	// DefaultCleanupInterval is how often the janitor deletes expired rows
	// unless WithCleanupInterval says otherwise.
	DefaultCleanupInterval = time.Minute
	// DefaultCleanupBatch is the most rows one transaction of the janitor
	// deletes unless WithCleanupBatch says otherwise.
	DefaultCleanupBatch = 1000
)

// MaxKeyLen is the longest key, and the longest owner token, the table
// holds (VARBINARY(255) on MySQL; bytea on PostgreSQL, bounded alike); a longer one is [storage.ErrInvalid]. The
// middleware's storage keys and owner tokens are far shorter.
const MaxKeyLen = 255

// ErrTableName is wrapped by the error of [New] and [Schema] for a table
// name that WithTable does not accept.
var ErrTableName = errors.New("sqlstore: invalid table name")

// ErrLocked is wrapped by the error of Extend, Complete and Release by an
// entry's owner, and of Remove, when the entry's row is locked by a
// transaction under way that fenced it (see [Store.Fence]): they answer at
// once instead of waiting for its end, and changed nothing. It is not
// [storage.ErrNotOwner]: the middleware tries again (the heartbeat at its
// next renewal; Complete and Release with backoff), and succeeds once the
// transaction has ended.
var ErrLocked = errors.New("sqlstore: entry locked by a transaction under way")

// ErrRecordTooLarge is wrapped by the error of Complete for a record that
// does not fit one statement of the server (MySQL's max_allowed_packet,
// less 1 KiB for the rest of the statement; on PostgreSQL, the 1 GB limit
// of one field, less the same). It wraps [storage.ErrTooLarge]: nothing
// was changed, the entry is still the owner's, and the middleware
// completes it instead as done but not replayable (retries get 409
// ErrNotReplayable; the handler does not run again). Keep the
// middleware's largest record (idem.WithMaxResponseBody, 1 MiB by
// default, plus the status line and headers) below the server's
// max_allowed_packet, so that responses are replayed.
var ErrRecordTooLarge = fmt.Errorf("sqlstore: record larger than the server's max_allowed_packet allows: %w", storage.ErrTooLarge)

// Store is a storage.Store on a database/sql database. Create it with
// [New]; the zero value is not usable. It is safe for concurrent use.
type Store struct {
	db      *sql.DB
	dialect Dialect
	table   string // as given, for messages
	quoted  string
	bare    string
	sql     statements

	cleanupEvery time.Duration
	batch        int

	mu       sync.Mutex
	prepared map[string]*sql.Stmt
	packet   int64 // the server's max_allowed_packet, once read
	// maxRecord is WithMaxRecordBytes's bound; 0: none.
	maxRecord int

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
}

// WithMaxRecordBytes bounds the records Complete keeps to n bytes: a
// longer one is [ErrRecordTooLarge] (the middleware then keeps the key
// done but not replayable), as one over the server's own limit is (see
// [Store.Complete]). n <= 0, the default, leaves only the server's limit.
// A store shared by applications that cannot all bound their responses
// may use it to bound the table's rows.
func WithMaxRecordBytes(n int) Option {
	return func(c *config) { c.maxRecord = max(n, 0) }
}

// WithTable sets the table, [DefaultTable] by default: a name of lower-case
// ASCII letters, digits and underscores that does not start with a digit,
// of at most 51 bytes (so that the names of its constraints, the table's
// and a suffix of up to 12 bytes, fit MySQL's 64 and PostgreSQL's 63),
// optionally after a database name (MySQL) or schema name (PostgreSQL)
// of the same kind, of at most 64 bytes (MySQL) or 63 (PostgreSQL), and a
// dot ("idem.keys"). Give each application sharing a database its own
// table.
func WithTable(name string) Option { return func(c *config) { c.table = name } }

// WithCleanupInterval sets how often the janitor deletes expired rows,
// [DefaultCleanupInterval] by default; d <= 0 keeps the default.
func WithCleanupInterval(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.cleanupEvery = d
		}
	}
}

// WithCleanupBatch sets the most rows one transaction of the janitor
// deletes, [DefaultCleanupBatch] by default; n <= 0 keeps the default.
func WithCleanupBatch(n int) Option {
	return func(c *config) {
		if n > 0 {
			c.batch = n
		}
	}
}

// New returns a Store that keeps its entries in the table of db's database
// (see WithTable), speaking dialect ([MySQL] or [PostgreSQL]), and starts its janitor
// goroutine; call Close to stop it. It sends nothing to the database:
// create the table with [Store.CreateTable], or with a migration of your
// own that runs [Schema]'s text. db stays the caller's: Close does not
// close it.
//
// db's connections must be in autocommit mode (the default; do not set
// autocommit=0 in the DSN), and on PostgreSQL run their statements under
// READ COMMITTED (the default; see the package documentation). The store prepares its statements on each
// connection the first time it uses them (one round trip per statement
// and connection), and then runs each in one round trip.
//
// It fails when db or dialect is nil, and with an error wrapping
// [ErrTableName] when WithTable's name is not accepted.
func New(db *sql.DB, dialect Dialect, opts ...Option) (*Store, error) {
	if db == nil {
		return nil, errors.New("sqlstore: nil db")
	}
	if dialect == nil {
		return nil, errors.New("sqlstore: nil dialect")
	}
	c := config{table: DefaultTable, cleanupEvery: DefaultCleanupInterval, batch: DefaultCleanupBatch}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	bare, err := parseTable(dialect, c.table)
	if err != nil {
		return nil, err
	}
	quoted := dialect.quote(c.table)
	s := &Store{db: db, dialect: dialect, table: c.table, quoted: quoted, bare: bare, sql: dialect.sql(quoted),
		cleanupEvery: c.cleanupEvery, batch: c.batch, maxRecord: c.maxRecord, prepared: map[string]*sql.Stmt{}}
	ctx, stop := context.WithCancel(context.Background())
	s.stop = stop
	s.janitor.Add(1)
	go s.runJanitor(ctx)
	return s, nil
}

// Close stops the janitor goroutine, cancelling a cleanup under way, waits
// for it to exit, and closes the store's prepared statements. It is
// idempotent, safe to call concurrently, and always returns nil. It does
// not close db. The store stays usable after Close (it prepares its
// statements again); expired rows are then deleted only by
// [Store.Cleanup] or when a key is acquired again.
func (s *Store) Close() error {
	s.once.Do(s.stop)
	s.janitor.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	for q, st := range s.prepared {
		st.Close()
		delete(s.prepared, q)
	}
	return nil
}

// Table returns the table's name, as given to WithTable.
func (s *Store) Table() string { return s.table }

//go:embed schema_mysql.sql
var mysqlSchema string

//go:embed schema_postgres.sql
var postgresSchema string

var tableName = regexp.MustCompile(`^(?:([a-z_][a-z0-9_]{0,63})\.)?([a-z_][a-z0-9_]{0,50})$`)

// parseTable checks a name given to WithTable for dialect and returns
// its last part.
func parseTable(dialect Dialect, name string) (string, error) {
	m := tableName.FindStringSubmatch(name)
	if m == nil || len(m[1]) > dialect.maxIdent() {
		return "", fmt.Errorf("%w %q: want lower-case letters, digits and underscores, not starting with a digit, "+
			"at most 51 bytes, optionally after a database name and a dot", ErrTableName, name)
	}
	return m[2], nil
}

// Schema returns the SQL that creates the table name (as WithTable takes
// it; "" means [DefaultTable]) in dialect, with its indexes, when it does
// not exist: the text of the package's schema_mysql.sql or
// schema_postgres.sql with the name replaced (on PostgreSQL, three
// statements: run them as one script). It is what [Store.CreateTable] runs, for teams that
// run their own migrations.
func Schema(dialect Dialect, name string) (string, error) {
	if dialect == nil {
		return "", errors.New("sqlstore: nil dialect")
	}
	if name == "" {
		name = DefaultTable
	}
	bare, err := parseTable(dialect, name)
	if err != nil {
		return "", err
	}
	return dialect.schema(dialect.quote(name), bare), nil
}

// CreateTable creates the store's table and its indexes unless the table
// exists (CREATE TABLE IF NOT EXISTS: on MySQL one statement, so
// instances starting together do not trip over each other; on PostgreSQL,
// whose IF NOT EXISTS is not safe from two sessions at once, the table
// and its indexes after an advisory lock, in one implicit transaction).
// The database user needs CREATE on the database (schema).
func (s *Store) CreateTable(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, s.dialect.create(s.dialect.schema(s.quoted, s.bare), s.quoted)); err != nil {
		return fmt.Errorf("sqlstore: creating table %s: %w", s.table, err)
	}
	return nil
}

// stmt returns the prepared statement of q, preparing it on first use. A
// failed preparation (the table does not exist yet) is not remembered.
func (s *Store) stmt(ctx context.Context, q string) (*sql.Stmt, error) {
	s.mu.Lock()
	st := s.prepared[q]
	s.mu.Unlock()
	if st != nil {
		return st, nil
	}
	st, err := s.db.PrepareContext(ctx, q)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old := s.prepared[q]; old != nil {
		st.Close()
		return old, nil
	}
	s.prepared[q] = st
	return st, nil
}

// cached returns the prepared statement of q, or nil when it is not
// prepared yet.
func (s *Store) cached(q string) *sql.Stmt {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.prepared[q]
}

// deadlockTries is how many times a statement chosen as a deadlock victim
// (MySQL error 1213; PostgreSQL's 40P01, or a serialization failure,
// 40001) is run in all. The store's statements are single-row
// autocommit statements that take their locks in one order, so a deadlock
// needs a third party (an application's transaction on the table, or a
// duplicate INSERT behind one that rolled back); running the statement
// again is then right, since it changed nothing.
const deadlockTries = 3

// exec runs q with args and returns the rows it affected.
func (s *Store) exec(ctx context.Context, q string, args ...any) (int64, error) {
	for try := 1; ; try++ {
		st, err := s.stmt(ctx, q)
		if err != nil {
			return 0, err
		}
		res, err := st.ExecContext(ctx, args...)
		if err != nil {
			if try < deadlockTries && s.dialect.classify(err) == errDeadlock {
				continue
			}
			return 0, err
		}
		return res.RowsAffected()
	}
}

// queryRow runs q with args and scans its one row into dest; found is
// false when it answered none.
func (s *Store) queryRow(ctx context.Context, q string, args []any, dest ...any) (found bool, err error) {
	for try := 1; ; try++ {
		st, err := s.stmt(ctx, q)
		if err != nil {
			return false, err
		}
		err = st.QueryRowContext(ctx, args...).Scan(dest...)
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, sql.ErrNoRows):
			return false, nil
		case try < deadlockTries && s.dialect.classify(err) == errDeadlock:
			continue
		}
		return false, err
	}
}

// row is a key's row as Acquire, Complete, Release and Extend read it.
type row struct {
	state       string
	owner, fp   []byte
	left, held  int64 // µs left of the expiry, and of a committed row's lease
	issued      bool  // taken from an issue (issue_ttl set)
	recordOrSum []byte
}

func (r *row) dest() []any {
	return []any{&r.state, &r.owner, &r.fp, &r.left, &r.held, &r.issued, &r.recordOrSum}
}

func (r *row) live() bool { return r.left > 0 }

func (r *row) mine(owner string) bool { return string(r.owner) == owner }

// read reads key's row with q (read, probe or peek). locked is set when q
// (probe) found the row locked.
func (s *Store) read(ctx context.Context, q, key string) (r row, found, locked bool, err error) {
	found, err = s.queryRow(ctx, q, []any{[]byte(key)}, r.dest()...)
	if err != nil && s.dialect.classify(err) == errLocked {
		return row{}, false, true, nil
	}
	return r, found, false, err
}

// ms gives d in whole milliseconds, rounded up, for a d > 0.
func ms(d time.Duration) int64 {
	n := int64(d / time.Millisecond)
	if d%time.Millisecond != 0 {
		n++
	}
	return n
}

// leftOf turns µs left into a lease left in whole milliseconds, rounded
// up, at least 1 ms (as the other stores answer it).
func leftOf(us int64) time.Duration {
	return max(time.Duration((us+999)/1000)*time.Millisecond, time.Millisecond)
}

func checkKey(key, owner string) error {
	switch {
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w: key of %d bytes, over %d", storage.ErrInvalid, len(key), MaxKeyLen)
	case len(owner) > MaxKeyLen:
		return fmt.Errorf("%w: owner of %d bytes, over %d", storage.ErrInvalid, len(owner), MaxKeyLen)
	}
	return nil
}

// lockedTries is how many times Acquire finds a row it is to take locked
// before it answers that the entry is in flight. Between tries it reads
// the row again (a few milliseconds apart): a lock held by another
// statement of the store lasts one statement, after which the row shows
// what that statement did; a Fence's lock lasts its transaction, during
// which the row shows what it was before.
const lockedTries = 4

// Acquire implements [storage.Store.Acquire]. A committed entry (see
// [Store.Fence]) is in flight while the lease of the execution that
// committed it runs, and then [storage.Committed]. While the transaction
// that fenced the entry is open, the entry is in flight, answered at once
// from the row as it was before the Fence (see Row locks in the package
// documentation). Given an issued entry, it takes it as AcquireIssued
// does. Errors wrap [storage.ErrInvalid], or say that the database could
// not be reached or failed.
func (s *Store) Acquire(ctx context.Context, key, owner, fingerprint string, lease time.Duration) (storage.Result, error) {
	if err := storage.CheckAcquire(key, owner, fingerprint, lease); err != nil {
		return storage.Result{}, fmt.Errorf("sqlstore: acquire: %w", err)
	}
	if err := checkKey(key, owner); err != nil {
		return storage.Result{}, fmt.Errorf("sqlstore: acquire: %w", err)
	}
	res, err := s.acquire(ctx, false, key, owner, fingerprint, lease)
	if err != nil {
		return storage.Result{}, fmt.Errorf("sqlstore: acquire: %w", err)
	}
	return res, nil
}

// AcquireIssued implements [storage.Issuer.AcquireIssued]. A committed
// entry, and one whose fenced transaction is open, is answered as Acquire
// answers it. Errors wrap [storage.ErrInvalid], or say that the database
// could not be reached or failed.
func (s *Store) AcquireIssued(ctx context.Context, key, owner, fingerprint string, lease time.Duration) (storage.Result, error) {
	if err := storage.CheckAcquire(key, owner, fingerprint, lease); err != nil {
		return storage.Result{}, fmt.Errorf("sqlstore: acquire issued: %w", err)
	}
	if err := checkKey(key, owner); err != nil {
		return storage.Result{}, fmt.Errorf("sqlstore: acquire issued: %w", err)
	}
	res, err := s.acquire(ctx, true, key, owner, fingerprint, lease)
	if err != nil {
		return storage.Result{}, fmt.Errorf("sqlstore: acquire issued: %w", err)
	}
	return res, nil
}

// acquire is Acquire, or AcquireIssued when issued is set. It reads the
// row without a lock and answers from it when it is live and not to be
// taken; otherwise it inserts a row (none there), or takes the row with
// an UPDATE whose WHERE checks again that it is to be taken; when that
// finds a row, or changes none, another request got there first, and it
// reads again.
func (s *Store) acquire(ctx context.Context, issued bool, key, owner, fp string, lease time.Duration) (storage.Result, error) {
	if s.cached(s.sql.fence) == nil {
		// For the Fence this execution may run: see Fence.
		if _, err := s.stmt(ctx, s.sql.fence); err != nil {
			return storage.Result{}, err
		}
	}
	locked := 0
	for try := 1; ; try++ {
		if try > maxRaces {
			return storage.Result{}, fmt.Errorf("the row changed under %d reads in a row", maxRaces)
		}
		r, found, _, err := s.read(ctx, s.sql.read, key)
		if err != nil {
			return storage.Result{}, err
		}
		if !found || !r.live() {
			if issued {
				return storage.Result{State: storage.NotIssued}, nil
			}
		}
		if !found {
			_, err := s.exec(ctx, s.sql.insert, []byte(key), []byte(owner), []byte(fp), ms(lease))
			if err == nil {
				return storage.Result{State: storage.Acquired}, nil
			}
			if s.dialect.classify(err) == errDuplicate {
				continue // inserted meanwhile: read it
			}
			return storage.Result{}, err
		}
		if r.live() {
			switch {
			case r.state == "done":
				return storage.Result{State: storage.Done, Fingerprint: string(r.fp), Record: r.recordOrSum}, nil
			case r.state == "committed" && r.held > 0:
				return storage.Result{State: storage.InFlight, Fingerprint: string(r.fp), LeaseLeft: leftOf(r.held)}, nil
			case r.state == "committed":
				return storage.Result{State: storage.Committed, Fingerprint: string(r.fp)}, nil
			case r.state == "processing" && !r.mine(owner):
				return storage.Result{State: storage.InFlight, Fingerprint: string(r.fp), LeaseLeft: leftOf(r.left)}, nil
			case r.state != "processing" && r.state != "issued":
				return storage.Result{}, fmt.Errorf("unexpected row: state %q", r.state)
			}
		}
		// To be taken: expired, issued, or the caller's own (a resend).
		// An issued row cannot be fenced: the UPDATE waits, for one
		// statement at most, for another request taking it. An expired row
		// or the caller's may be held by a Fence's transaction: the probe
		// fails at once instead of waiting.
		if r.state != "issued" || !r.live() {
			_, _, isLocked, err := s.read(ctx, s.sql.probe, key)
			if err != nil {
				return storage.Result{}, err
			}
			if isLocked {
				if locked++; locked >= lockedTries {
					left := r.left
					if r.state == "committed" {
						left = r.held
					}
					return storage.Result{State: storage.InFlight, Fingerprint: string(r.fp), LeaseLeft: leftOf(left)}, nil
				}
				if err := pause(ctx, locked); err != nil {
					return storage.Result{}, err
				}
				continue
			}
		}
		q := s.sql.take
		if issued {
			q = s.sql.takeIssued
		}
		n, err := s.exec(ctx, q, []byte(owner), []byte(owner), []byte(owner), []byte(fp), ms(lease), []byte(key), []byte(owner))
		if err != nil {
			return storage.Result{}, err
		}
		if n == 1 {
			return storage.Result{State: storage.Acquired}, nil
		}
		// Changed meanwhile: read it again.
	}
}

// maxRaces bounds the reads of one Acquire: each read after the first
// follows a write that found the row changed by another request, which
// a few requests on one key make rare and an endless run impossible.
const maxRaces = 50

// pause waits a few milliseconds before the try-th read of a locked row.
func pause(ctx context.Context, try int) error {
	t := time.NewTimer(time.Duration(try) * 2 * time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Issue implements [storage.Issuer.Issue]: it inserts an issued row, or
// replaces an expired row of any state. A row whose fenced transaction is
// open is in use: ErrExists, at once. Errors wrap [storage.ErrExists] or
// [storage.ErrInvalid], or say that the database could not be reached or
// failed.
func (s *Store) Issue(ctx context.Context, key string, ttl time.Duration) error {
	switch {
	case key == "":
		return fmt.Errorf("sqlstore: issue: %w: empty key", storage.ErrInvalid)
	case ttl <= 0:
		return fmt.Errorf("sqlstore: issue: %w: ttl %v", storage.ErrInvalid, ttl)
	}
	if err := checkKey(key, ""); err != nil {
		return fmt.Errorf("sqlstore: issue: %w", err)
	}
	r, found, _, err := s.read(ctx, s.sql.peek, key)
	if err != nil {
		return fmt.Errorf("sqlstore: issue: %w", err)
	}
	switch {
	case !found:
		_, err := s.exec(ctx, s.sql.issueInsert, []byte(key), ms(ttl), ms(ttl))
		switch {
		case err == nil:
			return nil
		case s.dialect.classify(err) == errDuplicate:
			return fmt.Errorf("sqlstore: issue: %w", storage.ErrExists)
		}
		return fmt.Errorf("sqlstore: issue: %w", err)
	case r.live():
		return fmt.Errorf("sqlstore: issue: %w", storage.ErrExists)
	}
	// Expired: replace it, unless a transaction holds it.
	_, _, locked, err := s.read(ctx, s.sql.probe, key)
	if err != nil {
		return fmt.Errorf("sqlstore: issue: %w", err)
	}
	if locked {
		return fmt.Errorf("sqlstore: issue: %w", storage.ErrExists)
	}
	n, err := s.exec(ctx, s.sql.issueTake, ms(ttl), ms(ttl), []byte(key))
	if err != nil {
		return fmt.Errorf("sqlstore: issue: %w", err)
	}
	if n == 0 {
		return fmt.Errorf("sqlstore: issue: %w", storage.ErrExists)
	}
	return nil
}

// packetOverhead is what a Complete's statement needs beside its record.
const packetOverhead = 1024

// maxPacket returns the server's max_allowed_packet, read once.
func (s *Store) maxPacket(ctx context.Context) (int64, error) {
	s.mu.Lock()
	p := s.packet
	s.mu.Unlock()
	if p > 0 {
		return p, nil
	}
	if s.sql.maxPacket == "" {
		return maxField, nil
	}
	if err := s.db.QueryRowContext(ctx, s.sql.maxPacket).Scan(&p); err != nil {
		return 0, err
	}
	s.mu.Lock()
	s.packet = p
	s.mu.Unlock()
	return p, nil
}

// lockedAnswer is the answer of Complete, Release or Extend (op) whose
// probe found the row locked: ErrLocked when the row, as it was before
// the lock, is the owner's live processing or committed row; otherwise
// what the row says (a row another owner held cannot become the
// caller's). The owner's row counts even once its lease has run out: the
// transaction that holds it may be the owner's, fenced in time, and
// about to commit. done is what a done row answers.
func (s *Store) lockedAnswer(ctx context.Context, op, key, owner string, done func(r row) error) error {
	r, found, _, err := s.read(ctx, s.sql.peek, key)
	switch {
	case err != nil:
		return fmt.Errorf("sqlstore: %s: %w", op, err)
	case found && r.mine(owner) && (r.state == "processing" || r.state == "committed"):
		return fmt.Errorf("sqlstore: %s: %w", op, ErrLocked)
	case found && r.live() && r.state == "done" && done != nil:
		return done(r)
	}
	return fmt.Errorf("sqlstore: %s: %w", op, storage.ErrNotOwner)
}

// Complete implements [storage.Store.Complete]. It also completes the
// owner's committed entry (see [Store.Fence]). A done entry keeps the
// owner that completed it: a Complete of it is a resend (nil) only with
// that owner and the same record (compared by SHA-256 in the database).
// When a transaction that fenced the owner's entry is still open, it
// returns at once an error wrapping [ErrLocked], having changed nothing.
// A record that does not fit the server's max_allowed_packet (MySQL) or
// 1 GB (PostgreSQL), or is longer than [WithMaxRecordBytes] allows, is
// [ErrRecordTooLarge], and changes nothing. Errors wrap
// [storage.ErrNotOwner], [ErrLocked], [ErrRecordTooLarge] or
// [storage.ErrInvalid], or say that the database could not be reached or
// failed.
func (s *Store) Complete(ctx context.Context, key, owner string, record []byte, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("sqlstore: complete: %w: ttl %v", storage.ErrInvalid, ttl)
	}
	if record == nil {
		record = []byte{}
	}
	limit, err := s.maxPacket(ctx)
	if err != nil {
		return fmt.Errorf("sqlstore: complete: %w", err)
	}
	if s.maxRecord > 0 && len(record) > s.maxRecord {
		return fmt.Errorf("sqlstore: complete: %w: %d bytes, WithMaxRecordBytes %d", ErrRecordTooLarge, len(record), s.maxRecord)
	}
	if int64(len(record))+packetOverhead > limit {
		return fmt.Errorf("sqlstore: complete: %w: %d bytes, max_allowed_packet %d", ErrRecordTooLarge, len(record), limit)
	}
	sum := sha256.Sum256(record)
	resend := func(r row) error {
		if r.mine(owner) && bytes.Equal(r.recordOrSum, []byte(fmt.Sprintf("%x", sum))) {
			return nil
		}
		return fmt.Errorf("sqlstore: complete: %w", storage.ErrNotOwner)
	}
	r, found, locked, err := s.read(ctx, s.sql.probe, key)
	switch {
	case err != nil:
		return fmt.Errorf("sqlstore: complete: %w", err)
	case locked:
		return s.lockedAnswer(ctx, "complete", key, owner, resend)
	case !found || !r.live():
		return fmt.Errorf("sqlstore: complete: %w", storage.ErrNotOwner)
	case r.state == "done":
		return resend(r)
	case !r.mine(owner) || (r.state != "processing" && r.state != "committed"):
		return fmt.Errorf("sqlstore: complete: %w", storage.ErrNotOwner)
	}
	n, err := s.exec(ctx, s.sql.complete, record, ms(ttl), []byte(key), []byte(owner))
	if err != nil {
		if s.dialect.classify(err) == errTooLarge {
			return fmt.Errorf("sqlstore: complete: %w: %w", ErrRecordTooLarge, err)
		}
		return fmt.Errorf("sqlstore: complete: %w", err)
	}
	if n == 1 {
		return nil
	}
	return fmt.Errorf("sqlstore: complete: %w", storage.ErrNotOwner)
}

// Release implements [storage.Store.Release], with one exception: the
// owner's committed entry (see [Store.Fence]) is not deleted; its lease
// ends (a retry gets ErrNotReplayable at once), and Release returns nil.
// An entry taken from an issue becomes issued again, for the issue's
// whole TTL, unless it was committed. When a transaction that fenced the
// owner's entry is still open, it returns at once an error wrapping
// [ErrLocked], having changed nothing. Errors wrap [storage.ErrNotOwner]
// or [ErrLocked], or say that the database could not be reached or
// failed.
func (s *Store) Release(ctx context.Context, key, owner string) error {
	r, found, locked, err := s.read(ctx, s.sql.probe, key)
	switch {
	case err != nil:
		return fmt.Errorf("sqlstore: release: %w", err)
	case locked:
		r, found, _, err := s.read(ctx, s.sql.peek, key)
		switch {
		case err != nil:
			return fmt.Errorf("sqlstore: release: %w", err)
		case found && r.mine(owner) && (r.state == "processing" || r.state == "committed"):
			return fmt.Errorf("sqlstore: release: %w", ErrLocked)
		case !found || !r.live() || r.state == "issued":
			return nil // nothing held
		}
		return fmt.Errorf("sqlstore: release: %w", storage.ErrNotOwner)
	case !found || !r.live():
		return nil // nothing held
	case r.state == "issued":
		return nil // a resend of a release that made it issued again
	case !r.mine(owner) || r.state == "done":
		return fmt.Errorf("sqlstore: release: %w", storage.ErrNotOwner)
	}
	var q string
	switch {
	case r.state == "committed":
		q = s.sql.releaseUnheld
	case r.issued:
		q = s.sql.releaseBack
	default:
		q = s.sql.releaseDelete
	}
	if _, err := s.exec(ctx, q, []byte(key), []byte(owner)); err != nil {
		return fmt.Errorf("sqlstore: release: %w", err)
	}
	// A write that found the row changed meanwhile (taken by another owner
	// after the lease, or committed by the owner's Fence) changed nothing:
	// nil is true of the time the probe read it.
	return nil
}

// Extend implements [storage.Store.Extend]. On the owner's committed entry
// (see [Store.Fence]) it extends the lease during which the entry is in
// flight, not the entry's expiry (its TTL's). While the transaction that
// fenced the owner's entry is open, it returns at once an error wrapping
// [ErrLocked], not ErrNotOwner, having changed nothing. Errors wrap
// [storage.ErrNotOwner], [ErrLocked] or [storage.ErrInvalid], or say that
// the database could not be reached or failed.
func (s *Store) Extend(ctx context.Context, key, owner string, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("sqlstore: extend: %w: lease %v", storage.ErrInvalid, lease)
	}
	r, found, locked, err := s.read(ctx, s.sql.probe, key)
	switch {
	case err != nil:
		return fmt.Errorf("sqlstore: extend: %w", err)
	case locked:
		return s.lockedAnswer(ctx, "extend", key, owner, nil)
	case !found || !r.live() || !r.mine(owner) || (r.state != "processing" && r.state != "committed"):
		return fmt.Errorf("sqlstore: extend: %w", storage.ErrNotOwner)
	}
	n, err := s.exec(ctx, s.sql.extend, ms(lease), ms(lease), []byte(key), []byte(owner))
	if err != nil {
		return fmt.Errorf("sqlstore: extend: %w", err)
	}
	if n == 0 {
		return fmt.Errorf("sqlstore: extend: %w", storage.ErrNotOwner)
	}
	return nil
}

// Cleanup deletes the expired rows of the table, in batches of at most
// WithCleanupBatch rows each, one after another until one finds fewer,
// and returns how many it deleted. A batch reads the oldest expired keys
// through the index on expires, without a lock; then, for each, a locking
// read with NOWAIT skips the row if a transaction holds it (a Fence's, or
// another statement's), and an autocommit DELETE removes it if it is
// still expired: no statement waits, and none holds more than one row's
// lock, for one statement (one round trip for the batch, and two per
// row). The
// janitor calls it; so may a scheduler of your own. It stops at the first
// error, such as the end of ctx, and returns it with the count so far.
func (s *Store) Cleanup(ctx context.Context) (int64, error) {
	var total int64
	for {
		found, n, err := s.cleanupBatch(ctx)
		total += n
		if err != nil {
			return total, fmt.Errorf("sqlstore: cleanup: %w", err)
		}
		if found < int64(s.batch) {
			return total, nil
		}
	}
}

// cleanupBatch deletes at most one batch of expired rows and returns how
// many expired rows it found (a full batch asks for another) and how many
// it deleted.
func (s *Store) cleanupBatch(ctx context.Context) (found, deleted int64, err error) {
	keys, err := s.expiredKeys(ctx)
	if err != nil {
		return 0, 0, err
	}
	for _, k := range keys {
		var one int
		_, err := s.queryRow(ctx, s.sql.cleanupLock, []any{k}, &one)
		switch {
		case err != nil && s.dialect.classify(err) == errLocked:
			continue // held by a transaction: the next run tries again
		case err != nil:
			return int64(len(keys)), deleted, err
		}
		n, err := s.exec(ctx, s.sql.cleanupDelete, k)
		if err != nil {
			return int64(len(keys)), deleted, err
		}
		deleted += n
	}
	return int64(len(keys)), deleted, nil
}

// expiredKeys returns the oldest expired keys, at most a batch.
func (s *Store) expiredKeys(ctx context.Context) ([][]byte, error) {
	st, err := s.stmt(ctx, s.sql.cleanupSelect)
	if err != nil {
		return nil, err
	}
	rows, err := st.QueryContext(ctx, s.batch)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var keys [][]byte
	for rows.Next() {
		var k []byte
		if err := rows.Scan(&k); err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	return keys, rows.Err()
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
