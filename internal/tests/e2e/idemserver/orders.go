package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/response"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/pgstore"
	"github.com/idemkit/idem/storage/sqlstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pgFlags are the flags of the PostgreSQL mode: with -pg, the records are
// in pgstore's table and POST /orders is an order service whose business
// row and fence share one transaction.
//
//	idemserver -pg DSN [-pg-store pgstore|sqlstore] [-pg-table idem_keys] [-orders-table orders] [-pg-conns 16]
//	           [-gate-at before-fence|after-commit] [-rebuild] [-no-fence]
//
// The handler, in one transaction begun with the request's context,
// inserts the order (key, execution id, pid, sequence number, request id,
// owner token, unix nanoseconds) into the orders table, then calls
// Store.Fence, then commits, then answers 201 with a JSON body made of the
// row alone, so that -rebuild (idem.WithRebuild: a retry of a key whose
// execution committed but whose response was not stored gets the response
// rebuilt from its order row) answers the same bytes. The orders table has
// no unique constraint on the key: the count of its rows per key is the
// number of business changes that committed, whatever idem did. A fence
// that finds the lease lost makes the handler roll back and answer 409; a
// database error, 503 (which the middleware does not store).
//
// The gate (see main.go) holds the handlers inside the transaction, after
// the insert and before the fence (-gate-at before-fence, the default), or
// after the commit, before the response is stored (after-commit): a test
// can stop or kill the process there. -no-fence breaks the service on
// purpose, to test the tests: it commits without the fence.
//
// The tables must exist (the tests create them, so that processes
// starting together do not race to): pgstore's, and the orders table
// with the columns id (bigserial), key, exec, rid, owner (text), pid
// (int), seq and at_ns (bigint).
//
// With -pg-store sqlstore, the same service runs on PostgreSQL through
// database/sql and pgx's driver (github.com/jackc/pgx/v5/stdlib): records
// in sqlstore's table (-pg-table, sqlstore.PostgreSQL), the order
// inserted, Store.Fence called and the transaction committed on one
// *sql.Tx; the other flags are the same (-pg-conns bounds the sql.DB's
// connections).
//
// With -mysql DSN instead (a go-sql-driver/mysql DSN naming the database),
// the same service runs on MySQL or MariaDB through database/sql, as with
// -pg-store sqlstore: records in sqlstore's table (-mysql-table,
// sqlstore.MySQL), the orders table's id an AUTO_INCREMENT.
type pgFlags struct {
	dsn, table, orders string
	pgStore            string
	mysql, sqlTable    string
	conns              int
	gateAt             string
	rebuild, noFence   bool
}

func (f *pgFlags) register() {
	flag.StringVar(&f.dsn, "pg", "", "PostgreSQL DSN: records in pgstore, and POST /orders commits an order row with the fence")
	flag.StringVar(&f.table, "pg-table", pgstore.DefaultTable, "the records' table on PostgreSQL (pgstore's, or sqlstore's with -pg-store sqlstore)")
	flag.StringVar(&f.pgStore, "pg-store", "pgstore", "the records' store with -pg: pgstore (pgx) or sqlstore (database/sql, pgx's driver, sqlstore.PostgreSQL)")
	flag.StringVar(&f.mysql, "mysql", "", "MySQL or MariaDB DSN (go-sql-driver/mysql, naming the database): records in sqlstore, and POST /orders as with -pg")
	flag.StringVar(&f.sqlTable, "mysql-table", sqlstore.DefaultTable, "sqlstore's table")
	flag.StringVar(&f.orders, "orders-table", "orders", "the orders table (see pgFlags)")
	flag.IntVar(&f.conns, "pg-conns", 16, "the pool's most connections")
	flag.StringVar(&f.gateAt, "gate-at", "", "where the gate holds the handlers: with -pg before-fence (default) or after-commit; "+
		"else after-count (default), before-count or after-store (see main.go)")
	flag.BoolVar(&f.rebuild, "rebuild", false, "answer a retry of a committed execution whose response was not stored from its order row (idem.WithRebuild)")
	flag.BoolVar(&f.noFence, "no-fence", false, "test of the tests: commit the order without Store.Fence")
}

// orders is the order service of the database modes: PostgreSQL through
// pgx and pgstore (-pg), MySQL or MariaDB through database/sql and
// sqlstore (-mysql).
type orders struct {
	db    database
	gate  *gate
	after bool // the gate is after the commit
	fence bool
	delay time.Duration
	seq   atomic.Int64
}

// database is what the order service needs of its database: the records'
// store, and transactions that insert an order and fence it.
type database interface {
	store() storage.Store
	// begin starts a transaction with the request's context.
	begin(ctx context.Context) (orderTx, error)
	// lookup reads key's first order into ord; false when there is none.
	lookup(ctx context.Context, key string, ord *order) (bool, error)
	// drop deletes key's entry: the broken store of -steal-leases.
	drop(ctx context.Context, key string) error
	close() error
}

// orderTx is a transaction of the order service.
type orderTx interface {
	// insert inserts ord and sets its ID.
	insert(ctx context.Context, ord *order) error
	// fence is the store's Fence in the transaction.
	fence(ctx context.Context) error
	commit(ctx context.Context) error
	rollback(ctx context.Context)
}

// gateAfterCommit checks -gate-at for a database mode and reports whether
// the gate is after the commit.
func gateAfterCommit(gateAt *string) (bool, error) {
	if *gateAt == "" {
		*gateAt = "before-fence"
	}
	if *gateAt != "before-fence" && *gateAt != "after-commit" {
		return false, fmt.Errorf("-gate-at %q: want before-fence or after-commit", *gateAt)
	}
	return *gateAt == "after-commit", nil
}

// open connects to the PostgreSQL of -pg and returns the service, on the
// store that -pg-store names.
func (f *pgFlags) open(g *gate, delay time.Duration) (*orders, error) {
	switch f.pgStore {
	case "pgstore":
	case "sqlstore":
		return f.openSQLPG(g, delay)
	default:
		return nil, fmt.Errorf("-pg-store %q: want pgstore or sqlstore", f.pgStore)
	}
	after, err := gateAfterCommit(&f.gateAt)
	if err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(f.dsn)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(f.conns)
	// A connection that a restarted server broke is found at its next use;
	// a pool that checks the idle ones often finds it sooner.
	cfg.HealthCheckPeriod = time.Second
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, err
	}
	st, err := pgstore.New(pool, pgstore.WithTable(f.table))
	if err != nil {
		pool.Close()
		return nil, err
	}
	t := pgx.Identifier{f.orders}.Sanitize()
	db := &pgDB{
		pool: pool, st: st,
		insertSQL: "INSERT INTO " + t + " (key, exec, pid, seq, rid, owner, at_ns) VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
		lookupSQL: "SELECT id, exec, pid, seq, rid, owner, at_ns FROM " + t + " WHERE key = $1 ORDER BY id LIMIT 1",
	}
	return &orders{db: db, gate: g, after: after, fence: !f.noFence, delay: delay}, nil
}

// pgDB is the PostgreSQL mode's database: pgx and pgstore.
type pgDB struct {
	pool                 *pgxpool.Pool
	st                   *pgstore.Store
	insertSQL, lookupSQL string
}

func (d *pgDB) store() storage.Store { return d.st }

// close stops the store's janitor and closes the pool.
func (d *pgDB) close() error {
	err := d.st.Close()
	d.pool.Close()
	return err
}

func (d *pgDB) drop(ctx context.Context, key string) error {
	_, err := d.pool.Exec(ctx, "DELETE FROM "+pgx.Identifier{d.st.Table()}.Sanitize()+" WHERE key = $1", []byte(key))
	return err
}

func (d *pgDB) lookup(ctx context.Context, key string, ord *order) (bool, error) {
	err := d.pool.QueryRow(ctx, d.lookupSQL, key).Scan(&ord.ID, &ord.Exec, &ord.PID, &ord.Seq, &ord.RID, &ord.Owner, &ord.AtNanos)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

func (d *pgDB) begin(ctx context.Context) (orderTx, error) {
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return pgTx{d, tx}, nil
}

type pgTx struct {
	d  *pgDB
	tx pgx.Tx
}

func (t pgTx) insert(ctx context.Context, ord *order) error {
	return t.tx.QueryRow(ctx, t.d.insertSQL, ord.Key, ord.Exec, ord.PID, ord.Seq, ord.RID, ord.Owner, ord.AtNanos).Scan(&ord.ID)
}

func (t pgTx) fence(ctx context.Context) error  { return t.d.st.Fence(ctx, t.tx) }
func (t pgTx) commit(ctx context.Context) error { return t.tx.Commit(ctx) }
func (t pgTx) rollback(ctx context.Context)     { t.tx.Rollback(ctx) }

// close closes the service's database.
func (o *orders) close() error { return o.db.close() }

// order is a row of the orders table, and the response's body.
type order struct {
	Key       string `json:"key"`
	ID        int64  `json:"order"`
	Exec      string `json:"exec"`
	PID       int    `json:"pid"`
	Seq       int64  `json:"seq"`
	RID       string `json:"rid"`
	Owner     string `json:"owner"`
	AtNanos   int64  `json:"at_ns"`
	Protected bool   `json:"protected"`
}

func (o *orders) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	info, _ := idem.FromContext(ctx)
	pid, seq := os.Getpid(), o.seq.Add(1)
	ord := order{Key: info.Key, Exec: strconv.Itoa(pid) + "-" + strconv.FormatInt(seq, 10), PID: pid, Seq: seq,
		RID: r.Header.Get("X-Request-Id"), Owner: info.Owner, AtNanos: time.Now().UnixNano(), Protected: info.Protected}
	if ord.Owner == "" {
		ord.Owner = "-"
	}
	tx, err := o.db.begin(ctx)
	if err != nil {
		unavailable(w, "begin", err)
		return
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		tx.rollback(rctx) // after commit, a no-op
	}()
	if err := tx.insert(ctx, &ord); err != nil {
		unavailable(w, "insert", err)
		return
	}
	if !o.after {
		o.gate.pass(ctx)
	}
	if o.fence {
		if err := tx.fence(ctx); errors.Is(err, storage.ErrNotOwner) {
			log.Printf("fence refused %s (owner %.8s): %v", ord.Exec, ord.Owner, err)
			// Another execution holds the key: a retry gets its answer.
			w.Header().Set("X-Exec", ord.Exec)
			w.Header().Set("Retry-After", "1")
			http.Error(w, "lease lost: the order was not created", http.StatusConflict)
			return
		} else if err != nil {
			unavailable(w, "fence", err)
			return
		}
	}
	if err := tx.commit(ctx); err != nil {
		unavailable(w, "commit", err)
		return
	}
	if o.after {
		o.gate.pass(ctx)
	}
	if o.delay > 0 {
		time.Sleep(o.delay)
	}
	o.write(w, ord)
}

// write answers 201 with the order: the same bytes for the same row.
func (o *orders) write(w http.ResponseWriter, ord order) {
	body, _ := json.Marshal(ord)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Exec", ord.Exec)
	w.WriteHeader(http.StatusCreated)
	w.Write(body)
}

// rebuild answers a retry of a key whose execution committed but whose
// response was not stored, from the key's order row (idem.WithRebuild).
func (o *orders) rebuild(w http.ResponseWriter, r *http.Request) bool {
	info, _ := idem.FromContext(r.Context())
	ord := order{Key: info.Key, Protected: true}
	found, err := o.db.lookup(r.Context(), info.Key, &ord)
	switch {
	case err == nil && !found:
		log.Printf("rebuild %s: no order", info.Key)
		return false
	case err != nil:
		// The database failed: not the order's answer, and not a replay.
		w.Header().Del(response.ReplayedHeader)
		unavailable(w, "rebuild", err)
		return true
	}
	o.write(w, ord)
	return true
}

// unavailable answers 503 for a database error: not stored, so a retry
// runs again once the database is back.
func unavailable(w http.ResponseWriter, step string, err error) {
	log.Printf("%s %s: %v", time.Now().Format("15:04:05.000"), step, err)
	w.Header().Set("Retry-After", "1")
	http.Error(w, step+": "+err.Error(), http.StatusServiceUnavailable)
}
