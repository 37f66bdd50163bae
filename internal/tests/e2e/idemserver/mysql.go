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
)

// openMySQL connects to the MySQL or MariaDB of -mysql (a
// go-sql-driver/mysql DSN naming the database; parseTime=true is added)
// and returns the service: records in sqlstore's table (-mysql-table),
// orders in -orders-table, with the columns of pgFlags' (id an
// AUTO_INCREMENT bigint).
func (f *pgFlags) openMySQL(g *gate, delay time.Duration) (*orders, error) {
	after, err := gateAfterCommit(&f.gateAt)
	if err != nil {
		return nil, err
	}
	cfg, err := mysql.ParseDSN(f.mysql)
	if err != nil {
		return nil, err
	}
	cfg.ParseTime = true
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(f.conns)
	db.SetMaxIdleConns(f.conns)
	st, err := sqlstore.New(db, sqlstore.MySQL, sqlstore.WithTable(f.sqlTable))
	if err != nil {
		db.Close()
		return nil, err
	}
	t := quoteMySQL(f.orders)
	d := &sqlDB{
		db: db, st: st,
		insertSQL: "INSERT INTO " + t + " (`key`, exec, pid, seq, rid, owner, at_ns) VALUES (?, ?, ?, ?, ?, ?, ?)",
		lookupSQL: "SELECT id, exec, pid, seq, rid, owner, at_ns FROM " + t + " WHERE `key` = ? ORDER BY id LIMIT 1",
		dropSQL:   "DELETE FROM " + quoteMySQL(st.Table()) + " WHERE `key` = ?",
	}
	return &orders{db: d, gate: g, after: after, fence: !f.noFence, delay: delay}, nil
}

// quoteMySQL quotes a table's name.
func quoteMySQL(name string) string { return "`" + strings.ReplaceAll(name, "`", "``") + "`" }

// sqlDB is the MySQL mode's database: database/sql and sqlstore.
type sqlDB struct {
	db                            *sql.DB
	st                            *sqlstore.Store
	insertSQL, lookupSQL, dropSQL string
}

func (d *sqlDB) store() storage.Store { return d.st }

// close stops the store's janitor and closes the pool.
func (d *sqlDB) close() error {
	return errors.Join(d.st.Close(), d.db.Close())
}

func (d *sqlDB) drop(ctx context.Context, key string) error {
	_, err := d.db.ExecContext(ctx, d.dropSQL, []byte(key))
	return err
}

func (d *sqlDB) lookup(ctx context.Context, key string, ord *order) (bool, error) {
	err := d.db.QueryRowContext(ctx, d.lookupSQL, key).Scan(&ord.ID, &ord.Exec, &ord.PID, &ord.Seq, &ord.RID, &ord.Owner, &ord.AtNanos)
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
	res, err := t.tx.ExecContext(ctx, t.d.insertSQL, ord.Key, ord.Exec, ord.PID, ord.Seq, ord.RID, ord.Owner, ord.AtNanos)
	if err != nil {
		return err
	}
	ord.ID, err = res.LastInsertId()
	return err
}

func (t sqlTx) fence(ctx context.Context) error  { return t.d.st.Fence(ctx, t.tx) }
func (t sqlTx) commit(ctx context.Context) error { return t.tx.Commit() }
func (t sqlTx) rollback(ctx context.Context)     { t.tx.Rollback() }
