package main

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/sqlstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// openMySQL connects to the MySQL or MariaDB of -mysql (a
// go-sql-driver/mysql DSN naming the database; parseTime=true is added)
// and returns the service: records in sqlstore's table (-mysql-table),
// orders in -orders-table, with the columns of pgFlags' (id an
// AUTO_INCREMENT bigint).
func (f *pgFlags) openMySQL(g *gate, delay time.Duration) (*orders, error) {
	cfg, err := mysql.ParseDSN(f.mysql)
	if err != nil {
		return nil, err
	}
	cfg.ParseTime = true
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	t := quoteMySQL(f.orders)
	return f.openSQL(g, delay, sql.OpenDB(conn), sqlstore.MySQL, f.sqlTable, quoteMySQL, sqlStmts{
		insert:    "INSERT INTO " + t + " (`key`, exec, pid, seq, rid, owner, at_ns) VALUES (?, ?, ?, ?, ?, ?, ?)",
		lookup:    "SELECT id, exec, pid, seq, rid, owner, at_ns FROM " + t + " WHERE `key` = ? ORDER BY id LIMIT 1",
		dropWhere: "`key` = ?",
	})
}

// openSQLPG connects to the PostgreSQL of -pg through database/sql and
// pgx's driver (github.com/jackc/pgx/v5/stdlib) and returns the service
// on sqlstore's PostgreSQL dialect (-pg-store sqlstore): records in
// sqlstore's table (-pg-table), orders in -orders-table, the table of
// pgFlags.
func (f *pgFlags) openSQLPG(g *gate, delay time.Duration) (*orders, error) {
	cfg, err := pgx.ParseConfig(f.dsn)
	if err != nil {
		return nil, err
	}
	t := quotePG(f.orders)
	// The order's id comes back with RETURNING: pgx's driver has no
	// LastInsertId. A connection that a restarted server broke is found
	// when it was idle for a second (the driver pings it before reuse),
	// else by the statement that fails on it (a 503), and then dropped:
	// database/sql has no periodic health check like the pgx pool of
	// -pg-store pgstore.
	return f.openSQL(g, delay, stdlib.OpenDB(*cfg), sqlstore.PostgreSQL, f.table, quotePG, sqlStmts{
		insert:    "INSERT INTO " + t + " (key, exec, pid, seq, rid, owner, at_ns) VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
		returning: true,
		lookup:    "SELECT id, exec, pid, seq, rid, owner, at_ns FROM " + t + " WHERE key = $1 ORDER BY id LIMIT 1",
		dropWhere: "key = $1",
	})
}

// sqlStmts are the statements of the order service on a database/sql
// database, in its dialect.
type sqlStmts struct {
	insert    string // the order's 7 columns (pgFlags' order)
	returning bool   // insert returns the id (else LastInsertId)
	lookup    string // the first order of a key
	dropWhere string // the condition on sqlstore's table of a key's entry
	drop      string // the DELETE of a key's entry, made of dropWhere
}

// openSQL returns the service on db (closed on failure) through sqlstore
// in dialect, with its records in table (quote quotes a table's name):
// the order inserted, Store.Fence called and the transaction committed on
// one *sql.Tx. -pg-conns bounds the pool's connections.
func (f *pgFlags) openSQL(g *gate, delay time.Duration, db *sql.DB, dialect sqlstore.Dialect, table string,
	quote func(string) string, stmts sqlStmts) (*orders, error) {
	after, err := gateAfterCommit(&f.gateAt)
	if err != nil {
		db.Close()
		return nil, err
	}
	db.SetMaxOpenConns(f.conns)
	db.SetMaxIdleConns(f.conns)
	st, err := sqlstore.New(db, dialect, sqlstore.WithTable(table))
	if err != nil {
		db.Close()
		return nil, err
	}
	stmts.drop = "DELETE FROM " + quote(st.Table()) + " WHERE " + stmts.dropWhere
	d := &sqlDB{db: db, st: st, stmts: stmts}
	return &orders{db: d, gate: g, after: after, fence: !f.noFence, delay: delay}, nil
}

// quoteMySQL quotes a table's name.
func quoteMySQL(name string) string { return "`" + strings.ReplaceAll(name, "`", "``") + "`" }

// quotePG quotes a table's name.
func quotePG(name string) string { return pgx.Identifier{name}.Sanitize() }

// sqlDB is the database of the database/sql modes: sqlstore on MySQL
// (-mysql) or on PostgreSQL (-pg with -pg-store sqlstore).
type sqlDB struct {
	db    *sql.DB
	st    *sqlstore.Store
	stmts sqlStmts
}

func (d *sqlDB) store() storage.Store { return d.st }

// close stops the store's janitor and closes the pool.
func (d *sqlDB) close() error {
	return errors.Join(d.st.Close(), d.db.Close())
}

func (d *sqlDB) drop(ctx context.Context, key string) error {
	_, err := d.db.ExecContext(ctx, d.stmts.drop, []byte(key))
	return err
}

func (d *sqlDB) lookup(ctx context.Context, key string, ord *order) (bool, error) {
	err := d.db.QueryRowContext(ctx, d.stmts.lookup, key).Scan(&ord.ID, &ord.Exec, &ord.PID, &ord.Seq, &ord.RID, &ord.Owner, &ord.AtNanos)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

func (d *sqlDB) begin(ctx context.Context) (orderTx, error) {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	return sqlTx{d, tx}, nil
}

type sqlTx struct {
	d  *sqlDB
	tx *sql.Tx
}

func (t sqlTx) insert(ctx context.Context, ord *order) error {
	args := []any{ord.Key, ord.Exec, ord.PID, ord.Seq, ord.RID, ord.Owner, ord.AtNanos}
	if t.d.stmts.returning {
		return t.tx.QueryRowContext(ctx, t.d.stmts.insert, args...).Scan(&ord.ID)
	}
	res, err := t.tx.ExecContext(ctx, t.d.stmts.insert, args...)
	if err != nil {
		return err
	}
	ord.ID, err = res.LastInsertId()
	return err
}

func (t sqlTx) fence(ctx context.Context) error  { return t.d.st.Fence(ctx, t.tx) }
func (t sqlTx) commit(ctx context.Context) error { return t.tx.Commit() }
func (t sqlTx) rollback(ctx context.Context)     { t.tx.Rollback() }
