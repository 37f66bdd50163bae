package sqlstore_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/idemkit/idem/internal/mysqltest"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/storage/sqlstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/lib/pq"
)

// counter counts the writes of a pool's connections: both drivers write
// each command (a query, a prepare, an execute, pgx's Bind and Execute
// with their Sync) in one write, and wait for its answer, so writes are
// round trips. Connections count from their handshake on: use every
// connection once before counting.
type counter struct{ writes atomic.Int64 }

func (c *counter) RoundTrips() int64 { return c.writes.Load() }
func (c *counter) Reset()            { c.writes.Store(0) }

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c *countingConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

func (c *counter) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: conn, writes: &c.writes}, nil
}

// backend is a database family and driver the shared tests run on: MySQL
// (MariaDB, through github.com/go-sql-driver/mysql) and PostgreSQL
// (through pgx's database/sql driver, and through github.com/lib/pq).
type backend struct {
	name    string
	dialect sqlstore.Dialect
	// open returns a *sql.DB on a database (MySQL) or schema (PostgreSQL,
	// through search_path) of the test's own, counting round trips in c
	// when it is not nil, with the session settings params.
	open func(t testing.TB, c *counter, params map[string]string) *sql.DB
	// now is the server's clock in µs, in SQL.
	now string
	// ordersDDL and orderInsert make and fill an orders table.
	ordersDDL, orderInsert string
	// pool opens a pool on a PostgreSQL dsn whose search_path is schema
	// (unless ""): the driver's.
	pool func(t testing.TB, dsn, schema string, c *counter, params map[string]string) *sql.DB
	// lockWait checks that a statement waiting on a row lock would wait
	// long (the server's default), so that "at once" means it.
	lockWait func(t testing.TB, db *sql.DB)
}

var backends = []*backend{
	{
		name: "mysql", dialect: sqlstore.MySQL, open: openMySQL,
		now:       "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))",
		ordersDDL: "CREATE TABLE orders (id BIGINT AUTO_INCREMENT PRIMARY KEY) ENGINE = InnoDB", orderInsert: "INSERT INTO orders () VALUES ()",
		lockWait: func(t testing.TB, db *sql.DB) {
			t.Helper()
			var n int
			if err := db.QueryRow("SELECT @@innodb_lock_wait_timeout").Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 50 {
				t.Fatalf("innodb_lock_wait_timeout is %d, want the default 50", n)
			}
		},
	},
	postgresBackend("postgres", pgOn),
	postgresBackend("postgres-libpq", pqOn),
}

// The backends, for the tests of one (pgB: PostgreSQL through pgx).
var mysqlB, pgB = backends[0], backends[1]

// postgresBackend is PostgreSQL through the driver whose pools pool opens.
func postgresBackend(name string, pool func(t testing.TB, dsn, schema string, c *counter, params map[string]string) *sql.DB) *backend {
	b := &backend{
		name: name, dialect: sqlstore.PostgreSQL, pool: pool,
		now:       "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint",
		ordersDDL: "CREATE TABLE orders (id bigserial PRIMARY KEY)", orderInsert: "INSERT INTO orders DEFAULT VALUES",
		lockWait: func(t testing.TB, db *sql.DB) {
			t.Helper()
			var lt, st string
			if err := db.QueryRow("SELECT current_setting('lock_timeout'), current_setting('statement_timeout')").Scan(&lt, &st); err != nil {
				t.Fatal(err)
			}
			if lt != "0" || st != "0" {
				t.Fatalf("lock_timeout %s, statement_timeout %s; want 0 (wait for ever, the default)", lt, st)
			}
		},
	}
	b.open = func(t testing.TB, c *counter, params map[string]string) *sql.DB { return openPostgres(t, b, c, params) }
	return b
}

// forEach runs f as a subtest per backend.
func forEach(t *testing.T, f func(t *testing.T, b *backend)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) { f(t, b) })
	}
}

// backendOf remembers the backend of each *sql.DB the tests open.
var backendOf sync.Map

func backendFor(t testing.TB, db *sql.DB) *backend {
	t.Helper()
	b, ok := backendOf.Load(db)
	if !ok {
		t.Fatal("a *sql.DB that testDB did not open")
	}
	return b.(*backend)
}

// testDB returns a *sql.DB on a database (schema) of the test's own,
// closed (and dropped) when the test ends.
func (b *backend) testDB(t testing.TB) *sql.DB { return b.db(t, nil, nil) }

func (b *backend) db(t testing.TB, c *counter, params map[string]string) *sql.DB {
	t.Helper()
	db := b.open(t, c, params)
	backendOf.Store(db, b)
	db.SetMaxOpenConns(60)
	db.SetMaxIdleConns(60)
	return db
}

func openMySQL(t testing.TB, c *counter, params map[string]string) *sql.DB {
	t.Helper()
	dsn := mysqltest.DSN(t)
	admin, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	name := mysqltest.Database(t, func(q string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := admin.ExecContext(ctx, q)
		return err
	})
	return mysqlOn(t, name, c, params)
}

// mysqlOn opens a pool on the MySQL database name.
func mysqlOn(t testing.TB, name string, c *counter, params map[string]string) *sql.DB {
	t.Helper()
	cfg, err := mysql.ParseDSN(mysqltest.WithDatabase(mysqltest.DSN(t), name))
	if err != nil {
		t.Fatal(err)
	}
	if c != nil {
		cfg.DialFunc = c.dial
	}
	cfg.Params = params
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	t.Cleanup(func() { db.Close() })
	return db
}

func openPostgres(t testing.TB, b *backend, c *counter, params map[string]string) *sql.DB {
	t.Helper()
	dsn := pgtest.DSN(t)
	admin := pgOn(t, dsn, "", nil, nil)
	r := make([]byte, 8)
	rand.Read(r)
	schema := "t_" + hex.EncodeToString(r)
	if _, err := admin.Exec("CREATE SCHEMA " + schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	return b.pool(t, dsn, schema, c, params)
}

// pgOn opens a pool on dsn whose search_path is schema (unless "").
func pgOn(t testing.TB, dsn, schema string, c *counter, params map[string]string) *sql.DB {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if schema != "" {
		cfg.RuntimeParams["search_path"] = schema
	}
	for k, v := range params {
		cfg.RuntimeParams[k] = v
	}
	if c != nil {
		cfg.DialFunc = c.dial
	}
	db := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { db.Close() })
	return db
}

// pqOn opens a pool of github.com/lib/pq's on dsn whose search_path is
// schema (unless "").
func pqOn(t testing.TB, dsn, schema string, c *counter, params map[string]string) *sql.DB {
	t.Helper()
	cfg, err := pq.NewConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Runtime == nil {
		cfg.Runtime = map[string]string{}
	}
	if schema != "" {
		cfg.Runtime["search_path"] = schema
	}
	for k, v := range params {
		cfg.Runtime[k] = v
	}
	conn, err := pq.NewConnectorConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if c != nil {
		conn.Dialer(pqDialer{c})
	}
	db := sql.OpenDB(conn)
	t.Cleanup(func() { db.Close() })
	return db
}

// pqDialer is a pq.Dialer whose connections count their writes.
type pqDialer struct{ c *counter }

func (d pqDialer) Dial(network, addr string) (net.Conn, error) {
	return d.c.dial(context.Background(), network, addr)
}

func (d pqDialer) DialTimeout(network, addr string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return d.c.dial(ctx, network, addr)
}

func (d pqDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return d.c.dial(ctx, network, addr)
}

// sameDB returns a second *sql.DB on db's database or schema, with the
// session settings params, closed when the test ends.
func sameDB(t testing.TB, db *sql.DB, params map[string]string) *sql.DB {
	t.Helper()
	b := backendFor(t, db)
	var db2 *sql.DB
	if b.dialect == sqlstore.MySQL {
		var name string
		if err := db.QueryRow("SELECT DATABASE()").Scan(&name); err != nil {
			t.Fatal(err)
		}
		db2 = mysqlOn(t, name, nil, params)
	} else {
		var schema string
		if err := db.QueryRow("SELECT current_schema()").Scan(&schema); err != nil {
			t.Fatal(err)
		}
		db2 = b.pool(t, pgtest.DSN(t), schema, nil, params)
	}
	backendOf.Store(db2, b)
	return db2
}

// open returns a store with its table on db, closed when the test ends.
func open(t testing.TB, db *sql.DB, opts ...sqlstore.Option) *sqlstore.Store {
	t.Helper()
	s, err := sqlstore.New(db, backendFor(t, db).dialect, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.CreateTable(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

// query turns q, written for MySQL with {table} for the default table,
// into db's dialect: backticks become double quotes and ? become $1, $2,
// ... on PostgreSQL.
func query(t testing.TB, db *sql.DB, q string) string {
	t.Helper()
	q = strings.ReplaceAll(q, "{table}", "`"+sqlstore.DefaultTable+"`")
	if backendFor(t, db).dialect == sqlstore.MySQL {
		return q
	}
	q = strings.ReplaceAll(q, "`", `"`)
	var out strings.Builder
	n := 0
	for _, c := range q {
		if c == '?' {
			n++
			out.WriteString("$" + strconv.Itoa(n))
			continue
		}
		out.WriteRune(c)
	}
	return out.String()
}

// exec runs a statement on db (see query).
func exec(t testing.TB, db *sql.DB, q string, args ...any) int64 {
	t.Helper()
	res, err := db.ExecContext(context.Background(), query(t, db, q), args...)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	n, _ := res.RowsAffected()
	return n
}

// shift moves time forward by d for the default table's rows: every
// expiry comes d sooner.
func shift(t testing.TB, db *sql.DB, d time.Duration) {
	t.Helper()
	exec(t, db, "UPDATE {table} SET expires = expires - ?, held_until = held_until - ?", d.Microseconds(), d.Microseconds())
}

// state returns the state of key's row, "" when there is none.
func state(t testing.TB, db *sql.DB, key string) string {
	t.Helper()
	var s string
	err := db.QueryRow(query(t, db, "SELECT state FROM {table} WHERE `key` = ?"), []byte(key)).Scan(&s)
	if err == sql.ErrNoRows {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}
