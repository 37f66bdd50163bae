package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/sqlstore"
	"github.com/idemkit/idem/storage/storagetest"
	"github.com/jackc/pgx/v5/pgconn"
)

// sqlState is an error with a SQLSTATE, as another driver's (lib/pq's
// *pq.Error has the same method).
type sqlState string

func (e sqlState) Error() string    { return "pq: " + string(e) }
func (e sqlState) SQLState() string { return string(e) }

// forPostgres runs f as a subtest per PostgreSQL driver.
func forPostgres(t *testing.T, f func(t *testing.T, b *backend)) {
	for _, b := range backends {
		if b.dialect == sqlstore.PostgreSQL {
			t.Run(b.name, func(t *testing.T) { f(t, b) })
		}
	}
}

// TestPostgresClassify: the dialect reads the SQLSTATE of any error in
// the chain with a method SQLState() string: pgx's *pgconn.PgError, or
// another driver's; and the server's own errors for a duplicate key and
// a locked row come out so through pgx's database/sql driver and lib/pq.
func TestPostgresClassify(t *testing.T) {
	for code, want := range map[string]string{"23505": "duplicate", "55P03": "locked", "40001": "deadlock", "40P01": "deadlock",
		"54000": "too large", "42P01": "other"} {
		for _, err := range []error{fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: code}), fmt.Errorf("wrapped: %w", sqlState(code))} {
			if got := sqlstore.Classify(sqlstore.PostgreSQL, err); got != want {
				t.Errorf("%T %s: %s, want %s", errors.Unwrap(err), code, got, want)
			}
		}
	}
	if got := sqlstore.Classify(sqlstore.PostgreSQL, errors.New("55P03")); got != "other" {
		t.Errorf("a plain error: %s", got)
	}
	forPostgres(t, func(t *testing.T, pgB *backend) {
		db := pgB.testDB(t)
		open(t, db)
		exec(t, db, "INSERT INTO {table} (`key`, state, owner, fingerprint, expires, since) VALUES ('\\x01', 'processing', '', '', 0, 0)")
		_, err := db.Exec(query(t, db, "INSERT INTO {table} (`key`, state, owner, fingerprint, expires, since) VALUES ('\\x01', 'processing', '', '', 0, 0)"))
		if got := sqlstore.Classify(sqlstore.PostgreSQL, err); got != "duplicate" {
			t.Errorf("a duplicate key: %v: %s", err, got)
		}
		tx, err := db.Begin()
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		exec(t, db, "SELECT 1") // a second connection, before tx holds the lock
		if _, err := tx.Exec(query(t, db, "SELECT 1 FROM {table} WHERE `key` = '\\x01' FOR UPDATE")); err != nil {
			t.Fatal(err)
		}
		_, err = db.Exec(query(t, db, "SELECT 1 FROM {table} WHERE `key` = '\\x01' FOR UPDATE NOWAIT"))
		if got := sqlstore.Classify(sqlstore.PostgreSQL, err); got != "locked" {
			t.Errorf("NOWAIT on a locked row: %v: %s", err, got)
		}
	})
}

// TestPostgresLongDurations: a lease, TTL or issue over 24.8 days in
// milliseconds, and a MinAge over 35 minutes in microseconds, do not fit
// PostgreSQL's integer, which it infers for a parameter in "? * 1000" or
// "? = 0"; the statements cast them to bigint.
func TestPostgresLongDurations(t *testing.T) {
	db := pgB.testDB(t)
	s := open(t, db)
	ctx := context.Background()
	const long = 400 * 24 * time.Hour
	var n int64
	if err := db.QueryRow("SELECT $1 * 1000", int64(long/time.Millisecond)).Scan(&n); err == nil {
		t.Logf("an uncast parameter took %d ms: the trap is gone from this driver or server", n)
	} else {
		t.Logf("an uncast parameter: %v", err)
	}
	if res, err := s.Acquire(ctx, "k", "o", "fp", long); err != nil || res.State != storage.Acquired {
		t.Fatalf("Acquire with a lease of %v: %+v, %v", long, res, err)
	}
	if err := s.Extend(ctx, "k", "o", long); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	if err := commit(db, s)(ctx, "k", "o", long); err != nil {
		t.Fatalf("Fence: %v", err)
	}
	if err := s.Complete(ctx, "k", "o", []byte("r"), long); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if err := s.Issue(ctx, "i", long); err != nil {
		t.Fatalf("Issue: %v", err)
	}
	e, err := s.Lookup(ctx, "k", true)
	if err != nil || e.State != storage.Done || time.Until(e.Expires) < long-time.Hour || string(e.Record) != "r" {
		t.Fatalf("Lookup: %+v, %v", e, err)
	}
	shift(t, db, -2*time.Hour) // since stays: the rows are not 2 h old
	exec(t, db, "UPDATE {table} SET since = since - ?", (3 * time.Hour).Microseconds())
	page, err := s.List(ctx, storage.Query{State: storage.Done, MinAge: 2 * time.Hour})
	if err != nil || len(page.Entries) != 1 {
		t.Fatalf("List with MinAge 2h: %+v, %v", page, err)
	}
}

// TestPostgresFenceStatementClock: the clock is the statement's, not the
// transaction's start (now()): a Fence in a transaction that began, and
// took its snapshot, while the lease ran is refused once the lease has
// run out.
func TestPostgresFenceStatementClock(t *testing.T) {
	forPostgres(t, func(t *testing.T, pgB *backend) {
		db := pgB.testDB(t)
		s := open(t, db)
		ctx := context.Background()
		// The transaction must begin while the lease runs: on a loaded
		// machine, where it may begin later, again with a longer lease,
		// and a key of its own (the test waits the lease out).
		var tx *sql.Tx
		var key string
		for lease, n := 500*time.Millisecond, 1; ; lease, n = 4*lease, n+1 {
			key = fmt.Sprintf("k%d", n)
			sent := time.Now()
			if res, err := s.Acquire(ctx, key, "o1", "fp", lease); err != nil || res.State != storage.Acquired {
				t.Fatal(res, err)
			}
			var err error
			if tx, err = db.BeginTx(ctx, nil); err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			var live bool
			if err := tx.QueryRow(query(t, db, "SELECT expires > (extract(epoch FROM now()) * 1000000)::bigint FROM {table} WHERE `key` = ?"), []byte(key)).Scan(&live); err != nil {
				t.Fatalf("the lease at the transaction's start: %v", err)
			}
			if live {
				break
			}
			if time.Since(sent) < lease {
				t.Fatalf("the lease at the transaction's start, less than %v after the Acquire: run out", lease)
			}
			tx.Rollback()
			if lease >= 8*time.Second {
				t.Skipf("the transaction began after a lease of %v had run out, three times: a loaded machine, no verdict", lease)
			}
			t.Logf("the transaction began after a lease of %v had run out (a loaded machine): trying again with %v", lease, 4*lease)
		}
		waitServerClock(t, db, key)
		err := s.Fence(storage.ContextWithLease(ctx, storage.Lease{Key: key, Owner: "o1", TTL: time.Hour}), tx)
		if !errors.Is(err, storage.ErrNotOwner) {
			t.Fatalf("Fence after the lease, in a transaction begun before: %v, want ErrNotOwner", err)
		}
	})
}

// TestPostgresFenceRepeatableRead: under REPEATABLE READ, a Fence after
// the transaction's snapshot, on a row the heartbeat's Extend renewed
// since, fails with a serialization failure (40001), not ErrNotOwner: the
// application rolls back and runs the transaction again (or fences
// first). A Fence as the transaction's first statement succeeds.
func TestPostgresFenceRepeatableRead(t *testing.T) {
	forPostgres(t, func(t *testing.T, pgB *backend) {
		db := pgB.testDB(t)
		s := open(t, db)
		ctx := context.Background()
		if res, err := s.Acquire(ctx, "k", "o1", "fp", time.Minute); err != nil || res.State != storage.Acquired {
			t.Fatal(res, err)
		}
		lease := storage.ContextWithLease(ctx, storage.Lease{Key: "k", Owner: "o1", TTL: time.Hour})
		tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if _, err := tx.Exec("SELECT 1"); err != nil { // the snapshot
			t.Fatal(err)
		}
		if err := s.Extend(ctx, "k", "o1", time.Minute); err != nil {
			t.Fatal(err)
		}
		err = s.Fence(lease, tx)
		var pe interface{ SQLState() string }
		if !errors.As(err, &pe) || pe.SQLState() != "40001" || errors.Is(err, storage.ErrNotOwner) {
			t.Fatalf("Fence after a renewal since the snapshot: %v, want a serialization failure", err)
		}
		tx.Rollback()
		tx, err = db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if err := s.Fence(lease, tx); err != nil {
			t.Fatalf("Fence first in the transaction: %v", err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if st := state(t, db, "k"); st != "committed" {
			t.Fatalf("%q, want committed", st)
		}
	})
}

// TestPostgresSessionSettings: with a TimeZone far from UTC, beside a
// second pool in another zone on the same table, the contract holds, 100
// owners taking one key get one winner, and the churn of every operation
// brings no error outside the contract's: stored times are numbers, and
// statement_timestamp() is an instant.
func TestPostgresSessionSettings(t *testing.T) {
	db := pgB.db(t, nil, map[string]string{"TimeZone": "Pacific/Chatham"})
	var zone string
	if err := db.QueryRow("SELECT current_setting('TimeZone')").Scan(&zone); err != nil || zone != "Pacific/Chatham" {
		t.Fatalf("session: %s, %v", zone, err)
	}
	s := open(t, db)
	db2 := sameDB(t, db, map[string]string{"TimeZone": "America/St_Johns"})
	s2 := open(t, db2)
	ctx := context.Background()
	if res, err := s.Acquire(ctx, "tz", "o1", "fp", time.Minute); err != nil || res.State != storage.Acquired {
		t.Fatal(res, err)
	}
	res, err := s2.Acquire(ctx, "tz", "o2", "fp", time.Minute)
	if err != nil || res.State != storage.InFlight || res.LeaseLeft < 50*time.Second || res.LeaseLeft > time.Minute {
		t.Fatalf("from another time zone: %+v, %v; want in flight with about a minute left", res, err)
	}
	storagetest.Run(t, func(t *testing.T) storagetest.Harness {
		return storagetest.Harness{Store: s, Commit: commit(db, s)}
	})
	for round := range 2 {
		var wg sync.WaitGroup
		var mu sync.Mutex
		won := 0
		for i := range 100 {
			wg.Go(func() {
				res, err := s.Acquire(ctx, "one", fmt.Sprint(round, "-", i), "fp", time.Minute)
				if err != nil {
					t.Errorf("Acquire: %v", err)
				}
				mu.Lock()
				defer mu.Unlock()
				if res.State == storage.Acquired {
					won++
				}
			})
		}
		wg.Wait()
		if won != 1 {
			t.Fatalf("round %d: %d acquired, want 1", round, won)
		}
		shift(t, db, time.Hour)
	}
	churn(t, s)
}

// TestPostgresSerializableDefault: with default_transaction_isolation
// set to serializable for the pool's sessions, the store's autocommit
// statements run under it, and the contract's sequential clauses hold;
// concurrent ones are not supported (a write that finds its row changed
// since its snapshot, or a read/write dependency, fails with 40001, which
// the store runs again at most twice): see the package documentation.
func TestPostgresSerializableDefault(t *testing.T) {
	db := pgB.db(t, nil, map[string]string{"default_transaction_isolation": "serializable"})
	var iso string
	if err := db.QueryRow("SELECT current_setting('transaction_isolation')").Scan(&iso); err != nil || iso != "serializable" {
		t.Fatalf("session: %s, %v", iso, err)
	}
	s := open(t, db)
	storagetest.Run(t, func(t *testing.T) storagetest.Harness {
		return storagetest.Harness{Store: s, Commit: commit(db, s)}
	})
}

// TestPostgresCreateTableConcurrent: CREATE TABLE IF NOT EXISTS is not
// safe from several sessions at once on PostgreSQL (one may fail with a
// unique violation on the catalog); CreateTable takes an advisory lock
// first, so 8 instances starting together all succeed.
func TestPostgresCreateTableConcurrent(t *testing.T) {
	db := pgB.testDB(t)
	for round := range 3 {
		table := fmt.Sprint("t", round)
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				s, err := sqlstore.New(db, sqlstore.PostgreSQL, sqlstore.WithTable(table))
				if err != nil {
					t.Error(err)
					return
				}
				defer s.Close()
				if err := s.CreateTable(context.Background()); err != nil {
					t.Errorf("CreateTable: %v", err)
				}
			})
		}
		wg.Wait()
	}
}

// TestPostgresSchema: Schema's text, names PostgreSQL would truncate
// refused, a reserved word as a name, a table in another schema, and the
// CHECKs.
func TestPostgresSchema(t *testing.T) {
	def, err := sqlstore.Schema(sqlstore.PostgreSQL, "")
	if err != nil || !strings.Contains(def, `CREATE TABLE IF NOT EXISTS "idem_keys"`) || !strings.Contains(def, `ON "idem_keys" (expires)`) {
		t.Fatalf("Schema default: %v\n%s", err, def)
	}
	other, err := sqlstore.Schema(sqlstore.PostgreSQL, "app.keys")
	if err != nil || !strings.Contains(other, `CREATE TABLE IF NOT EXISTS "app"."keys"`) ||
		!strings.Contains(other, "keys_state_check") || !strings.Contains(other, "INDEX IF NOT EXISTS keys_expires_idx") || strings.Contains(other, "idem_keys_") || strings.Contains(other, `"idem_keys"`) {
		t.Fatalf("Schema app.keys: %v\n%s", err, other)
	}
	if _, err := sqlstore.Schema(sqlstore.PostgreSQL, strings.Repeat("s", 64)+".keys"); !errors.Is(err, sqlstore.ErrTableName) {
		t.Errorf("a schema name of 64 bytes: %v, want ErrTableName", err)
	}
	if _, err := sqlstore.Schema(sqlstore.MySQL, strings.Repeat("s", 64)+".keys"); err != nil {
		t.Errorf("a database name of 64 bytes on MySQL: %v", err)
	}
	db := pgB.testDB(t)
	exec(t, db, "CREATE SCHEMA "+strings.Repeat("s", 63))
	t.Cleanup(func() { db.Exec("DROP SCHEMA " + strings.Repeat("s", 63) + " CASCADE") })
	ctx := context.Background()
	for _, name := range []string{"user", "select", strings.Repeat("s", 63) + ".order"} {
		s := open(t, db, sqlstore.WithTable(name))
		if err := s.CreateTable(ctx); err != nil {
			t.Fatalf("CreateTable %s again: %v", name, err)
		}
		if res, err := s.Acquire(ctx, "k", "o", "fp", time.Minute); err != nil || res.State != storage.Acquired {
			t.Fatalf("%s: %+v, %v", name, res, err)
		}
	}
	if _, err := db.Exec(`INSERT INTO "user" (key, state, owner, fingerprint, expires, since) VALUES ('x', 'bogus', '', '', 0, 0)`); err == nil {
		t.Error("a row in state 'bogus' was accepted")
	}
}

// TestPostgresByteaOutputEscape: with bytea_output set to escape (the
// text form of bytea before PostgreSQL 9.0), binary keys, fingerprints
// and records read back byte for byte through both drivers (pgx reads
// bytea in binary, lib/pq parses either text form).
func TestPostgresByteaOutputEscape(t *testing.T) {
	forPostgres(t, func(t *testing.T, b *backend) {
		db := b.db(t, nil, map[string]string{"bytea_output": "escape"})
		s := open(t, db)
		ctx := context.Background()
		record := []byte{0, '\\', 'x', 0xff, '\'', 1, 'a'}
		for i, k := range []string{"\x00\\x", "k\xff", "\\\\"} {
			fp := fmt.Sprint("fp\x00\xfe", i)
			if res, err := s.Acquire(ctx, k, "o", fp, time.Minute); err != nil || res.State != storage.Acquired {
				t.Fatalf("Acquire(%q): %+v, %v", k, res, err)
			}
			if res, err := s.Acquire(ctx, k, "o2", "x", time.Minute); err != nil || res.State != storage.InFlight || res.Fingerprint != fp {
				t.Fatalf("Acquire(%q) again: %+v, %v", k, res, err)
			}
			if err := s.Complete(ctx, k, "o", record, time.Hour); err != nil {
				t.Fatal(err)
			}
			if err := s.Complete(ctx, k, "o", record, time.Hour); err != nil {
				t.Fatalf("Complete resent: %v", err)
			}
			res, err := s.Acquire(ctx, k, "o2", "x", time.Minute)
			if err != nil || res.State != storage.Done || string(res.Record) != string(record) || res.Fingerprint != fp {
				t.Fatalf("replay of %q: %+v, %v", k, res, err)
			}
			e, err := s.Lookup(ctx, k, true)
			if err != nil || e.Key != k || string(e.Record) != string(record) {
				t.Fatalf("Lookup(%q): %+v, %v", k, e, err)
			}
		}
		page, err := s.List(ctx, storage.Query{Limit: 2})
		if err != nil || len(page.Entries) != 2 || page.Next == "" {
			t.Fatalf("List: %+v, %v", page, err)
		}
		if page, err = s.List(ctx, storage.Query{Limit: 2, Cursor: page.Next}); err != nil || len(page.Entries) != 1 {
			t.Fatalf("List, page 2: %+v, %v", page, err)
		}
	})
}

// TestPostgresPgstoreTable: pgstore's table and this package's are not
// interchangeable (timestamptz there, bigint microseconds here), and both
// default to idem_keys: CreateTable finds the table there and does
// nothing, and the store's statements then fail, changing nothing. Give
// each store its own table.
func TestPostgresPgstoreTable(t *testing.T) {
	db := pgB.testDB(t)
	exec(t, db, "CREATE TABLE idem_keys (key bytea PRIMARY KEY, state text NOT NULL, owner bytea NOT NULL, fingerprint bytea NOT NULL, "+
		"expires timestamptz NOT NULL, held_until timestamptz, record bytea, issue_ttl bigint, since timestamptz)")
	exec(t, db, "INSERT INTO idem_keys VALUES ('\\x6b', 'processing', 'o', 'fp', now() + interval '1 hour', NULL, NULL, NULL, now())")
	s := open(t, db)
	if _, err := s.Acquire(context.Background(), "k", "o2", "fp", time.Minute); err == nil {
		t.Fatal("Acquire on pgstore's table: no error")
	} else {
		t.Logf("Acquire on pgstore's table: %v", err)
	}
	if st := state(t, db, "k"); st != "processing" {
		t.Fatalf("pgstore's row: %q", st)
	}
}
