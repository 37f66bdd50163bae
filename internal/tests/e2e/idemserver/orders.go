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
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pgFlags are the flags of the PostgreSQL mode: with -pg, the records are
// in pgstore's table and POST /orders is an order service whose business
// row and fence share one transaction.
//
//	idemserver -pg DSN [-pg-table idem_keys] [-orders-table orders] [-pg-conns 16]
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
type pgFlags struct {
	dsn, table, orders string
	conns              int
	gateAt             string
	rebuild, noFence   bool
}

func (f *pgFlags) register() {
	flag.StringVar(&f.dsn, "pg", "", "PostgreSQL DSN: records in pgstore, and POST /orders commits an order row with the fence")
	flag.StringVar(&f.table, "pg-table", pgstore.DefaultTable, "pgstore's table")
	flag.StringVar(&f.orders, "orders-table", "orders", "the orders table (see pgFlags)")
	flag.IntVar(&f.conns, "pg-conns", 16, "the pool's most connections")
	flag.StringVar(&f.gateAt, "gate-at", "", "where the gate holds the handlers: with -pg before-fence (default) or after-commit; "+
		"else after-count (default), before-count or after-store (see main.go)")
	flag.BoolVar(&f.rebuild, "rebuild", false, "answer a retry of a committed execution whose response was not stored from its order row (idem.WithRebuild)")
	flag.BoolVar(&f.noFence, "no-fence", false, "test of the tests: commit the order without Store.Fence")
}

// orders is the order service of the PostgreSQL mode.
type orders struct {
	pool   *pgxpool.Pool
	store  *pgstore.Store
	table  string // sanitized
	gate   *gate
	after  bool // the gate is after the commit
	fence  bool
	delay  time.Duration
	seq    atomic.Int64
	insert string
	lookup string
}

// open connects to the database and returns the service.
func (f *pgFlags) open(g *gate, delay time.Duration) (*orders, error) {
	if f.gateAt == "" {
		f.gateAt = "before-fence"
	}
	if f.gateAt != "before-fence" && f.gateAt != "after-commit" {
		return nil, fmt.Errorf("-gate-at %q: want before-fence or after-commit", f.gateAt)
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
	return &orders{
		pool: pool, store: st, table: t, gate: g, after: f.gateAt == "after-commit", fence: !f.noFence, delay: delay,
		insert: "INSERT INTO " + t + " (key, exec, pid, seq, rid, owner, at_ns) VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
		lookup: "SELECT id, exec, pid, seq, rid, owner, at_ns FROM " + t + " WHERE key = $1 ORDER BY id LIMIT 1",
	}, nil
}

// close stops the store's janitor and closes the pool.
func (o *orders) close() error {
	err := o.store.Close()
	o.pool.Close()
	return err
}

// drop deletes key's entry: the broken store of -steal-leases.
func (o *orders) drop(ctx context.Context, key string) error {
	_, err := o.pool.Exec(ctx, "DELETE FROM "+pgx.Identifier{o.store.Table()}.Sanitize()+" WHERE key = $1", []byte(key))
	return err
}

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
	tx, err := o.pool.Begin(ctx)
	if err != nil {
		unavailable(w, "begin", err)
		return
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		tx.Rollback(rctx) // after Commit, a no-op
	}()
	if err := tx.QueryRow(ctx, o.insert, ord.Key, ord.Exec, ord.PID, ord.Seq, ord.RID, ord.Owner, ord.AtNanos).Scan(&ord.ID); err != nil {
		unavailable(w, "insert", err)
		return
	}
	if !o.after {
		o.gate.pass(ctx)
	}
	if o.fence {
		if err := o.store.Fence(ctx, tx); errors.Is(err, storage.ErrNotOwner) {
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
	if err := tx.Commit(ctx); err != nil {
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
	err := o.pool.QueryRow(r.Context(), o.lookup, info.Key).Scan(&ord.ID, &ord.Exec, &ord.PID, &ord.Seq, &ord.RID, &ord.Owner, &ord.AtNanos)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
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
