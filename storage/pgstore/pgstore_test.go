package pgstore_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/leakcheck"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/pgstore"
	"github.com/idemkit/idem/storage/storagetest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Main stops the shared PostgreSQL server and checks for leaked
// goroutines (the janitor's among them).
func TestMain(m *testing.M) { leakcheck.Main(pgtest.Wrap(m)) }

// db is a table of the test's own on the shared server, and a store on it.
type db struct {
	t     testing.TB
	pool  *pgxpool.Pool
	table string
	store *pgstore.Store
}

// storeMax is the WithMaxRecordBytes of the tests' stores, the contract
// suite's MaxRecord.
const storeMax = 1<<20 + 1024

// open creates a table of the test's own and a store on it (records of at
// most storeMax bytes, unless opts say otherwise), closed when the test
// ends.
func open(t testing.TB, opts ...pgstore.Option) *db {
	t.Helper()
	pool := testPool(t)
	return openOn(t, pool, opts...)
}

func openOn(t testing.TB, pool *pgxpool.Pool, opts ...pgstore.Option) *db {
	t.Helper()
	d := &db{t: t, pool: pool, table: testTable(t, pool)}
	s, err := pgstore.New(pool, append([]pgstore.Option{pgstore.WithMaxRecordBytes(storeMax)}, append(opts, pgstore.WithTable(d.table))...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.CreateTable(context.Background()); err != nil {
		t.Fatal(err)
	}
	d.store = s
	return d
}

// ident is the table's name as SQL.
func (d *db) ident() string { return pgx.Identifier{d.table}.Sanitize() }

// exec runs a statement on the table ({table} in q stands for its name).
func (d *db) exec(q string, args ...any) int64 {
	d.t.Helper()
	tag, err := d.pool.Exec(context.Background(), strings.ReplaceAll(q, "{table}", d.ident()), args...)
	if err != nil {
		d.t.Fatalf("%s: %v", q, err)
	}
	return tag.RowsAffected()
}

// shift moves time forward by dur for the table's rows, as redisAdvance
// does for Redis keys: every expiry comes dur sooner.
func (d *db) shift(dur time.Duration) {
	d.t.Helper()
	d.exec("UPDATE {table} SET expires = expires - $1::bigint * interval '1 microsecond', "+
		"held_until = held_until - $1::bigint * interval '1 microsecond'", dur.Microseconds())
}

// state returns the state of key's row, "" when there is none.
func (d *db) state(key string) string {
	d.t.Helper()
	var s string
	err := d.pool.QueryRow(context.Background(), "SELECT state FROM "+d.ident()+" WHERE key = $1", []byte(key)).Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) {
		return ""
	}
	if err != nil {
		d.t.Fatal(err)
	}
	return s
}

// frozenClock makes a clock of the test's own in the database, starting at
// the server's time: the SQL that reads it, for pgstore.WithClock, and a
// function that moves it forward. Its table and function are dropped
// when the test ends.
func frozenClock(t testing.TB, pool *pgxpool.Pool) (expr string, advance func(time.Duration)) {
	t.Helper()
	name := testTable(t, pool) // the clock's table
	fn := pgx.Identifier{name + "_now"}.Sanitize()
	tbl := pgx.Identifier{name}.Sanitize()
	ctx := context.Background()
	_, err := pool.Exec(ctx, "CREATE TABLE "+tbl+" (t timestamptz NOT NULL);\n"+
		"INSERT INTO "+tbl+" VALUES (clock_timestamp());\n"+
		"CREATE FUNCTION "+fn+"() RETURNS timestamptz VOLATILE LANGUAGE sql AS 'SELECT t FROM "+strings.ReplaceAll(tbl, "'", "''")+"'")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Exec(context.Background(), "DROP FUNCTION IF EXISTS "+fn+"()") })
	return fn + "()", func(d time.Duration) {
		t.Helper()
		if _, err := pool.Exec(ctx, "UPDATE "+tbl+" SET t = t + $1::bigint * interval '1 microsecond'", d.Microseconds()); err != nil {
			t.Fatal(err)
		}
	}
}

// harness is the contract suite's harness of store, whose table is in
// pool's database: Commit fences the owner's entry in a transaction that
// commits.
func harness(pool *pgxpool.Pool, store *pgstore.Store, advance func(time.Duration)) storagetest.Harness {
	return storagetest.Harness{Store: store, Advance: advance, MaxRecord: storeMax,
		Commit: func(ctx context.Context, key, owner string, ttl time.Duration) error {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(ctx)
			if err := store.Fence(storage.ContextWithLease(ctx, storage.Lease{Key: key, Owner: owner, TTL: ttl}), tx); err != nil {
				return err
			}
			return tx.Commit(ctx)
		}}
}

// TestContract runs the contract suite on the server's real clock: one
// store, one table; the expiry clauses poll.
func TestContract(t *testing.T) {
	// As many connections as the suite has concurrent acquirers, so that
	// they really run at once.
	d := openOn(t, testPool(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 50 }))
	storagetest.Run(t, func(t *testing.T) storagetest.Harness {
		return harness(d.pool, d.store, nil)
	})
}

// TestContractExecModes runs the contract suite through pgx's modes that
// prepare nothing, which a pool behind PgBouncer in transaction mode
// needs: the statements and their binary arguments work in each.
func TestContractExecModes(t *testing.T) {
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			pool := testPool(t, func(cfg *pgxpool.Config) {
				cfg.ConnConfig.DefaultQueryExecMode = mode
				cfg.MaxConns = 50
			})
			clock, advance := frozenClock(t, pool)
			d := openOn(t, pool, pgstore.WithClock(clock))
			storagetest.Run(t, func(t *testing.T) storagetest.Harness {
				return harness(pool, d.store, advance)
			})
		})
	}
}

// TestContractFrozenClock runs the contract suite with the database's
// clock stopped and moved by the suite: every clause, including the
// rounding to milliseconds, is checked exactly. A table per subtest.
func TestContractFrozenClock(t *testing.T) {
	pool := testPool(t)
	storagetest.Run(t, func(t *testing.T) storagetest.Harness {
		clock, advance := frozenClock(t, pool)
		d := openOn(t, pool, pgstore.WithClock(clock))
		return harness(pool, d.store, advance)
	})
}

func TestTableNames(t *testing.T) {
	for _, name := range []string{"idem_keys", "_x", "a1", "idem.keys", strings.Repeat("a", 51), strings.Repeat("s", 63) + ".t"} {
		if _, err := pgstore.Schema(name); err != nil {
			t.Errorf("Schema(%q): %v, want accepted", name, err)
		}
	}
	for _, name := range []string{"Idem", "1a", "a-b", "a b", `a"b`, "a;drop table x", "a.b.c", ".a", "a.", strings.Repeat("a", 52), strings.Repeat("s", 64) + ".t", "é"} {
		if _, err := pgstore.Schema(name); !errors.Is(err, pgstore.ErrTableName) {
			t.Errorf("Schema(%q): %v, want ErrTableName", name, err)
		}
		pool := (*pgxpool.Pool)(nil)
		if _, err := pgstore.New(pool, pgstore.WithTable(name)); err == nil {
			t.Errorf("New with a nil pool and table %q: no error", name)
		}
	}
	def, err := pgstore.Schema("")
	if err != nil || !strings.Contains(def, `CREATE TABLE IF NOT EXISTS "idem_keys"`) || !strings.Contains(def, `"idem_keys_expires_idx" ON "idem_keys"`) {
		t.Errorf("Schema(\"\"): %v\n%s", err, def)
	}
	q, _ := pgstore.Schema("app.keys")
	if !strings.Contains(q, `CREATE TABLE IF NOT EXISTS "app"."keys"`) || !strings.Contains(q, `"keys_expires_idx" ON "app"."keys"`) ||
		!strings.Contains(q, `DROP CONSTRAINT "keys_state_check"`) || strings.Contains(q, "idem_keys") {
		t.Errorf("Schema(app.keys):\n%s", q)
	}
}

// TestSchemaQualified runs a store on a table in a schema of its own.
func TestSchemaQualified(t *testing.T) {
	pool := testPool(t)
	schema := testTable(t, pool) // a fresh name, for the schema
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
	s, err := pgstore.New(pool, pgstore.WithTable(schema+".keys"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.CreateTable(ctx); err != nil {
		t.Fatal(err)
	}
	if res, err := s.Acquire(ctx, "k", "o", "fp", time.Minute); err != nil || res.State != storage.Acquired {
		t.Fatalf("Acquire: %+v, %v", res, err)
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".keys").Scan(&n); err != nil || n != 1 {
		t.Fatalf("rows in %s.keys: %d, %v", schema, n, err)
	}
}

// TestCreateTable: CreateTable is idempotent, and instances starting at
// once do not fail on each other's CREATE.
func TestCreateTable(t *testing.T) {
	d := open(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			s, err := pgstore.New(d.pool, pgstore.WithTable(d.table+"_2"))
			if err != nil {
				t.Error(err)
				return
			}
			defer s.Close()
			if err := s.CreateTable(ctx); err != nil {
				t.Errorf("concurrent CreateTable: %v", err)
			}
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		d.pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{d.table + "_2"}.Sanitize())
	})
	if err := d.store.CreateTable(ctx); err != nil {
		t.Fatalf("CreateTable of an existing table: %v", err)
	}
	rows, err := d.pool.Query(ctx, "SELECT indexname FROM pg_indexes WHERE tablename = $1 ORDER BY 1", d.table)
	if err != nil {
		t.Fatal(err)
	}
	indexes, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if want := []string{d.table + "_expires_idx", d.table + "_pkey", d.table + "_state_since_idx"}; err != nil || !slices.Equal(indexes, want) {
		t.Fatalf("indexes on %s: %q (%v), want %q", d.table, indexes, err, want)
	}
}

// TestCheckConstraints: the table refuses rows that are not entries.
func TestCheckConstraints(t *testing.T) {
	d := open(t)
	ctx := context.Background()
	for _, q := range []string{
		"INSERT INTO {table} (key, state, owner, fingerprint, expires) VALUES ('a', 'other', 'o', '', now() + interval '1 hour')",
		"INSERT INTO {table} (key, state, owner, fingerprint, expires) VALUES ('a', 'done', 'o', '', now() + interval '1 hour')",
		"INSERT INTO {table} (key, state, owner, fingerprint, expires, record) VALUES ('a', 'processing', 'o', '', now() + interval '1 hour', 'r')",
		"INSERT INTO {table} (key, state, owner, fingerprint, expires) VALUES ('a', 'issued', '', '', now() + interval '1 hour')",
		"INSERT INTO {table} (key, state, owner, fingerprint, expires, issue_ttl) VALUES ('a', 'issued', '', '', now() + interval '1 hour', 0)",
		"INSERT INTO {table} (key, state, owner, fingerprint, expires, record, issue_ttl) VALUES ('a', 'done', 'o', '', now() + interval '1 hour', 'r', 1000)",
		"INSERT INTO {table} (key, state, owner, fingerprint, expires, issue_ttl) VALUES ('a', 'committed', 'o', '', now() + interval '1 hour', 1000)",
	} {
		if _, err := d.pool.Exec(ctx, strings.ReplaceAll(q, "{table}", d.ident())); err == nil {
			t.Errorf("%s: accepted", q)
		}
	}
}

// TestRoundTrips counts the statements and round trips of each operation,
// on one connection whose statements are prepared already: a protected
// first execution costs 2, a replay 1.
func TestRoundTrips(t *testing.T) {
	var c counter
	pool := testPool(t, c.Configure, func(cfg *pgxpool.Config) { cfg.MaxConns = 1 })
	d := openOn(t, pool)
	s, ctx := d.store, context.Background()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// Prepare every statement on the connection.
	warm := func(key string) {
		s.Acquire(ctx, key, "o", "fp", time.Minute)
		s.Acquire(ctx, key, "o2", "fp", time.Minute)
		s.Extend(ctx, key, "o", time.Minute)
		s.Complete(ctx, key, "o", []byte("r"), time.Hour)
		s.Release(ctx, key, "o")
	}
	warm("warm")
	count := func(what string, want int64, f func()) {
		t.Helper()
		c.Reset()
		f()
		if st, rt := c.Statements(), c.RoundTrips(); st != want || rt != want {
			t.Errorf("%s: %d statements in %d round trips, want %d and %d", what, st, rt, want, want)
		}
	}
	count("first execution (Acquire, Complete)", 2, func() {
		res, err := s.Acquire(ctx, "k", "o1", "fp", time.Minute)
		must(err)
		if res.State != storage.Acquired {
			t.Fatalf("Acquire: %v", res.State)
		}
		must(s.Complete(ctx, "k", "o1", []byte("record"), time.Hour))
	})
	count("replay (Acquire)", 1, func() {
		if res, err := s.Acquire(ctx, "k", "o2", "fp", time.Minute); err != nil || res.State != storage.Done {
			t.Fatalf("Acquire: %+v, %v", res, err)
		}
	})
	count("in flight (Acquire)", 1, func() {
		s.Acquire(ctx, "k2", "o1", "fp", time.Minute)
		c.Reset()
		if res, err := s.Acquire(ctx, "k2", "o2", "fp", time.Minute); err != nil || res.State != storage.InFlight {
			t.Fatalf("Acquire: %+v, %v", res, err)
		}
	})
	count("Extend", 1, func() { must(s.Extend(ctx, "k2", "o1", time.Minute)) })
	count("Release", 1, func() { must(s.Release(ctx, "k2", "o1")) })

	// Issued keys: prepare the statements, then count.
	s.Issue(ctx, "warm-i", time.Hour)
	s.AcquireIssued(ctx, "warm-i", "o", "fp", time.Minute)
	count("Issue", 1, func() { must(s.Issue(ctx, "i", time.Hour)) })
	count("first execution of an issued key (AcquireIssued, Complete)", 2, func() {
		res, err := s.AcquireIssued(ctx, "i", "o1", "fp", time.Minute)
		must(err)
		if res.State != storage.Acquired {
			t.Fatalf("AcquireIssued: %v", res.State)
		}
		must(s.Complete(ctx, "i", "o1", []byte("record"), time.Hour))
	})
	count("replay of an issued key (AcquireIssued)", 1, func() {
		if res, err := s.AcquireIssued(ctx, "i", "o2", "fp", time.Minute); err != nil || res.State != storage.Done {
			t.Fatalf("AcquireIssued: %+v, %v", res, err)
		}
	})
	count("not issued (AcquireIssued)", 1, func() {
		if res, err := s.AcquireIssued(ctx, "never", "o2", "fp", time.Minute); err != nil || res.State != storage.NotIssued {
			t.Fatalf("AcquireIssued: %+v, %v", res, err)
		}
	})
	count("Release back to issued", 1, func() {
		must(s.Issue(ctx, "i2", time.Hour))
		if res, err := s.AcquireIssued(ctx, "i2", "o1", "fp", time.Minute); err != nil || res.State != storage.Acquired {
			t.Fatalf("AcquireIssued: %+v, %v", res, err)
		}
		c.Reset()
		must(s.Release(ctx, "i2", "o1"))
	})
	if st := d.state("i2"); st != "issued" {
		t.Fatalf("i2 is %q after Release, want issued", st)
	}
}

// beforeIssuedKeys is the table of the version before issued keys, as
// its schema.sql made it ({table} for its name), without comments.
const beforeIssuedKeys = `CREATE TABLE {table} (
    key         bytea       NOT NULL PRIMARY KEY,
    state       text        NOT NULL CHECK (state IN ('processing', 'committed', 'done')),
    owner       bytea       NOT NULL,
    fingerprint bytea       NOT NULL,
    expires     timestamptz NOT NULL,
    held_until  timestamptz,
    record      bytea,
    CHECK ((state = 'done') = (record IS NOT NULL))
);
CREATE INDEX ON {table} (expires);`

// migration returns the ALTER TABLE statements that the schema's comments
// give for a table of the version before issued keys, uncommented.
func migration(t *testing.T, schema string) string {
	t.Helper()
	_, rest, ok := strings.Cut(schema, "\n-- ALTER TABLE ")
	if !ok {
		t.Fatalf("no ALTER TABLE in the schema:\n%s", schema)
	}
	stmt, _, ok := strings.Cut(rest, ";\n")
	if !ok {
		t.Fatalf("the ALTER TABLE does not end:\n%s", rest)
	}
	return "ALTER TABLE " + strings.ReplaceAll(stmt, "\n--", "\n") + ";"
}

// TestMigrationBeforeIssuedKeys runs the ALTER TABLE that schema.sql
// documents (through Schema, for the test's table name) on a table of the
// version before issued keys: its rows stay, it ends with the columns and
// constraints of a table that CreateTable makes, and the store, issued
// keys included, passes the contract suite on it.
func TestMigrationBeforeIssuedKeys(t *testing.T) {
	pool := testPool(t)
	ctx := context.Background()
	old, fresh := testTable(t, pool), testTable(t, pool)
	oldID := pgx.Identifier{old}.Sanitize()
	if _, err := pool.Exec(ctx, strings.ReplaceAll(beforeIssuedKeys, "{table}", oldID)); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "INSERT INTO "+oldID+" (key, state, owner, fingerprint, expires, record) VALUES "+
		"('p', 'processing', 'o', 'fp', now() + interval '1 hour', NULL), ('d', 'done', 'o', 'fp', now() + interval '1 hour', 'r')"); err != nil {
		t.Fatal(err)
	}
	schema, err := pgstore.Schema(old)
	if err != nil {
		t.Fatal(err)
	}
	alter := migration(t, schema)
	if _, err := pool.Exec(ctx, alter); err != nil {
		t.Fatalf("%s\n%v", alter, err)
	}
	// The first instance of this version adds the since column and the
	// index on (state, since): CreateTable on the old table.
	if _, err := pool.Exec(ctx, schema); err != nil {
		t.Fatal(err)
	}
	openOn := func(table string, opts ...pgstore.Option) *pgstore.Store {
		s, err := pgstore.New(pool, append([]pgstore.Option{pgstore.WithMaxRecordBytes(storeMax)}, append(opts, pgstore.WithTable(table))...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	if err := openOn(fresh).CreateTable(ctx); err != nil {
		t.Fatal(err)
	}
	describe := func(table string) string {
		t.Helper()
		var cols, checks []string
		rows, err := pool.Query(ctx, "SELECT column_name || ' ' || data_type || ' ' || is_nullable FROM information_schema.columns "+
			"WHERE table_name = $1 ORDER BY column_name", table)
		if err != nil {
			t.Fatal(err)
		}
		cols, err = pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		// Constraints by definition; the CHECK on state by name too.
		rows, err = pool.Query(ctx, "SELECT CASE WHEN conname = $2 THEN 'state_check: ' ELSE '' END || pg_get_constraintdef(oid) "+
			"FROM pg_constraint WHERE conrelid = $1::regclass ORDER BY 1", pgx.Identifier{table}.Sanitize(), table+"_state_check")
		if err != nil {
			t.Fatal(err)
		}
		checks, err = pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(cols, "\n") + "\n" + strings.Join(checks, "\n")
	}
	if got, want := describe(old), describe(fresh); got != want {
		t.Fatalf("migrated table:\n%s\n\nwant, as CreateTable makes it:\n%s", got, want)
	}
	s := openOn(old)
	if res, err := s.Acquire(ctx, "d", "o2", "", time.Minute); err != nil || res.State != storage.Done || string(res.Record) != "r" {
		t.Fatalf("a done row of before the migration: %+v, %v", res, err)
	}
	if err := s.Release(ctx, "p", "o"); err != nil {
		t.Fatalf("Release of a processing row of before the migration: %v", err)
	}
	if res, err := s.AcquireIssued(ctx, "p", "o", "", time.Minute); err != nil || res.State != storage.NotIssued {
		t.Fatalf("AcquireIssued after the Release of a processing row of before the migration: %+v, %v; want not issued", res, err)
	}
	clock, advance := frozenClock(t, pool)
	s = openOn(old, pgstore.WithClock(clock))
	storagetest.Run(t, func(t *testing.T) storagetest.Harness {
		return harness(pool, s, advance)
	})
}

// TestReplayWritesNothing: an Acquire that finds a done entry, or another
// owner's live entry in flight, reads it from its snapshot and writes no
// row version (nor locks the row).
func TestReplayWritesNothing(t *testing.T) {
	d := open(t)
	s, ctx := d.store, context.Background()
	version := func(key string) string {
		var v string
		if err := d.pool.QueryRow(ctx, "SELECT xmin::text || ctid::text || ' ' || xmax::text FROM "+d.ident()+" WHERE key = $1", []byte(key)).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	s.Acquire(ctx, "done", "o1", "fp", time.Minute)
	if err := s.Complete(ctx, "done", "o1", []byte("r"), time.Hour); err != nil {
		t.Fatal(err)
	}
	before := version("done")
	for range 3 {
		if res, _ := s.Acquire(ctx, "done", "o2", "fp", time.Minute); res.State != storage.Done {
			t.Fatalf("replay: %v", res.State)
		}
	}
	if after := version("done"); after != before {
		t.Errorf("a replay wrote or locked a row version: %s, then %s", before, after)
	}
	s.Acquire(ctx, "busy", "o1", "fp", time.Minute)
	before = version("busy")
	if res, _ := s.Acquire(ctx, "busy", "o2", "fp", time.Minute); res.State != storage.InFlight {
		t.Fatalf("in flight: %v", res.State)
	}
	if after := version("busy"); after != before {
		t.Errorf("an Acquire of a key in flight wrote or locked a row version: %s, then %s", before, after)
	}
}

// TestCleanup: expired rows go, in batches, live ones stay, and a row
// another transaction has locked is skipped without waiting.
func TestCleanup(t *testing.T) {
	pool := testPool(t)
	clock, advance := frozenClock(t, pool)
	d := openOn(t, pool, pgstore.WithClock(clock), pgstore.WithCleanupBatch(3))
	s, ctx := d.store, context.Background()
	for i := range 10 {
		s.Acquire(ctx, "lease-"+string(rune('a'+i)), "o", "fp", time.Second)
	}
	s.Acquire(ctx, "live", "o", "fp", time.Hour)
	s.Acquire(ctx, "done", "o", "fp", time.Second)
	s.Complete(ctx, "done", "o", []byte("r"), time.Hour)
	s.Acquire(ctx, "locked", "o", "fp", time.Second)
	s.Issue(ctx, "issued", time.Second)
	s.Issue(ctx, "issued-live", time.Hour)
	advance(time.Minute)

	// Another transaction holds the lock on an expired row.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT 1 FROM "+d.ident()+" WHERE key = 'locked' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := s.Cleanup(cctx)
	if err != nil || n != 11 {
		t.Fatalf("Cleanup: %d rows, %v; want the 10 expired leases and the expired issue, and the locked row skipped", n, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{"live": "processing", "done": "done", "locked": "processing", "lease-a": "", "issued": "", "issued-live": "issued"} {
		if got := d.state(key); got != want {
			t.Errorf("after Cleanup, %s is %q, want %q", key, got, want)
		}
	}
	if n, err := s.Cleanup(ctx); err != nil || n != 1 {
		t.Fatalf("second Cleanup: %d rows, %v; want the row unlocked since", n, err)
	}
}

// TestJanitor: the janitor goroutine deletes expired rows on its own, and
// Close stops it (leakcheck, in TestMain, checks that it is gone).
func TestJanitor(t *testing.T) {
	pool := testPool(t)
	clock, advance := frozenClock(t, pool)
	d := openOn(t, pool, pgstore.WithClock(clock), pgstore.WithCleanupInterval(5*time.Millisecond))
	ctx := context.Background()
	d.store.Acquire(ctx, "k", "o", "fp", time.Second)
	advance(time.Minute)
	deadline := time.Now().Add(10 * time.Second)
	for d.state("k") != "" {
		if time.Now().After(deadline) {
			t.Fatal("the janitor did not delete an expired row within 10s")
		}
		time.Sleep(5 * time.Millisecond) // the janitor's ticker: real time
	}
	d.store.Close()
	d.store.Close() // idempotent
	// The store stays usable.
	if res, err := d.store.Acquire(ctx, "k", "o", "fp", time.Second); err != nil || res.State != storage.Acquired {
		t.Fatalf("Acquire after Close: %+v, %v", res, err)
	}
}

// TestErrorsWrap: errors name the operation and wrap the cause.
func TestErrorsWrap(t *testing.T) {
	d := open(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := d.store.Acquire(ctx, "k", "o", "fp", time.Minute)
	if !errors.Is(err, context.Canceled) || !strings.HasPrefix(err.Error(), "pgstore: acquire:") {
		t.Errorf("Acquire on a canceled context: %v", err)
	}
	if err := d.store.Release(ctx, "k", "o"); !errors.Is(err, context.Canceled) {
		t.Errorf("Release on a canceled context: %v", err)
	}
}

// TestCompleteOtherOwnerSameRecord: a done entry remembers the owner that
// completed it. A's lease runs out, B takes the key and completes it with
// R; A's Complete with the very same R is not B's resend: ErrNotOwner, and
// nothing changes. B's resend is one: nil.
func TestCompleteOtherOwnerSameRecord(t *testing.T) {
	pool := testPool(t)
	clock, advance := frozenClock(t, pool)
	d := openOn(t, pool, pgstore.WithClock(clock))
	s, ctx := d.store, context.Background()
	row := func() string {
		t.Helper()
		var r string
		if err := d.pool.QueryRow(ctx, "SELECT state || ' ' || encode(owner, 'escape') || ' ' || encode(fingerprint, 'escape') || ' ' || "+
			"encode(record, 'escape') || ' ' || expires::text || ' ' || xmin::text FROM "+d.ident()+" WHERE key = 'k'").Scan(&r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	if res, err := s.Acquire(ctx, "k", "A", "fp-A", 100*time.Millisecond); err != nil || res.State != storage.Acquired {
		t.Fatalf("A's Acquire: %+v, %v", res, err)
	}
	advance(time.Second) // A's lease has run out
	if res, err := s.Acquire(ctx, "k", "B", "fp-B", time.Minute); err != nil || res.State != storage.Acquired {
		t.Fatalf("B's Acquire after A's lease ran out: %+v, %v", res, err)
	}
	if err := s.Complete(ctx, "k", "B", []byte("R"), time.Hour); err != nil {
		t.Fatalf("B's Complete: %v", err)
	}
	before := row()
	if err := s.Complete(ctx, "k", "A", []byte("R"), time.Hour); !errors.Is(err, storage.ErrNotOwner) {
		t.Fatalf("A's Complete with B's record, after B completed: %v, want ErrNotOwner", err)
	}
	if after := row(); after != before {
		t.Fatalf("A's refused Complete changed the row: %s, then %s", before, after)
	}
	advance(time.Second)
	if err := s.Complete(ctx, "k", "B", []byte("R"), time.Hour); err != nil {
		t.Fatalf("B's resend: %v, want nil", err)
	}
	if err := s.Complete(ctx, "k", "B", []byte("other"), time.Hour); !errors.Is(err, storage.ErrNotOwner) {
		t.Fatalf("B's Complete with another record: %v, want ErrNotOwner", err)
	}
	if res, err := s.Acquire(ctx, "k", "C", "fp-B", time.Minute); err != nil || res.State != storage.Done || string(res.Record) != "R" || res.Fingerprint != "fp-B" {
		t.Fatalf("after the Completes: %+v, %v; want done with B's R", res, err)
	}
	if s := d.state("k"); s != "done" {
		t.Fatalf("entry %q, want done", s)
	}
}
