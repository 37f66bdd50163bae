package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/slowclock"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// app is a service whose handler inserts an order and fences in one
// transaction, behind the middleware, on a store that can "die".
type app struct {
	*db
	orders string // the orders table, as SQL
	store  *dying
	m      *idem.Middleware
	runs   atomic.Int64 // executions of the handler
}

// dying wraps the store: once died, Complete, Release and Extend reach
// nothing, as when the process is killed after the handler's commit.
type dying struct {
	storage.Store
	died atomic.Bool
}

var errDied = fmt.Errorf("the process died: %w", storage.ErrNotOwner) // not retried by the middleware

func (d *dying) Complete(ctx context.Context, key, owner string, rec []byte, ttl time.Duration) error {
	if d.died.Load() {
		return errDied
	}
	return d.Store.Complete(ctx, key, owner, rec, ttl)
}

func (d *dying) Release(ctx context.Context, key, owner string) error {
	if d.died.Load() {
		return errDied
	}
	return d.Store.Release(ctx, key, owner)
}

func (d *dying) Extend(ctx context.Context, key, owner string, lease time.Duration) error {
	if d.died.Load() {
		return errDied
	}
	return d.Store.Extend(ctx, key, owner, lease)
}

func newApp(t *testing.T, opts ...idem.Option) *app {
	t.Helper()
	return newAppOn(t, testPool(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 8 }), nil, opts...)
}

// newAppOn is newApp on pool, with the store's options storeOpts.
func newAppOn(t *testing.T, pool *pgxpool.Pool, storeOpts []pgstore.Option, opts ...idem.Option) *app {
	t.Helper()
	a := &app{db: openOn(t, pool, storeOpts...)}
	orders := testTable(t, pool)
	a.orders = pgx.Identifier{orders}.Sanitize()
	a.exec("CREATE TABLE " + a.orders + " (id serial PRIMARY KEY, owner text NOT NULL)")
	a.store = &dying{Store: a.db.store}
	m, err := idem.New(a.store, append([]idem.Option{idem.WithLease(time.Minute), idem.WithTTL(time.Hour)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := m.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	})
	a.m = m
	return a
}

// serve sends a POST with key ("" for none) through the middleware to a
// handler that runs h and, when h returns without error, answers 201.
func (a *app) serve(key string, h func(ctx context.Context) error) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader("{}"))
	if key != "" {
		r.Header.Set("Idempotency-Key", `"`+key+`"`)
	}
	w := httptest.NewRecorder()
	a.m.Serve(w, r, "/orders", func(w http.ResponseWriter, r *http.Request) {
		a.runs.Add(1)
		if err := h(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte("created"))
	})
	return w
}

// order is the handler's transaction: insert an order, fence, and end
// with end (commit, or roll back), after between, if not nil, ran with
// the transaction still open. It returns Fence's error.
func (a *app) order(ctx context.Context, between func(), end func(pgx.Tx) error) error {
	tx, err := a.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.Background())
	info, _ := idem.FromContext(ctx)
	if _, err := tx.Exec(ctx, "INSERT INTO "+a.orders+" (owner) VALUES ($1)", info.Owner); err != nil {
		return err
	}
	if err := a.store.Fence(ctx, tx); err != nil {
		return err
	}
	if between != nil {
		between()
	}
	return end(tx)
}

func commit(tx pgx.Tx) error   { return tx.Commit(context.Background()) }
func rollback(tx pgx.Tx) error { return tx.Rollback(context.Background()) }

// Fence is a method on the pgstore.Store; app.store wraps it (through
// issuing, in some tests).
func (d *dying) Fence(ctx context.Context, tx pgx.Tx) error {
	return d.Store.(interface {
		Fence(context.Context, pgx.Tx) error
	}).Fence(ctx, tx)
}

// issuing makes every entry the middleware acquires one taken from an
// issue: its Acquire issues the key (unless it has an entry) and takes it
// with AcquireIssued.
type issuing struct{ *pgstore.Store }

func (s issuing) Acquire(ctx context.Context, key, owner, fp string, lease time.Duration) (storage.Result, error) {
	if err := s.Issue(ctx, key, time.Hour); err != nil && !errors.Is(err, storage.ErrExists) {
		return storage.Result{}, err
	}
	return s.AcquireIssued(ctx, key, owner, fp, lease)
}

// newIssuingApp is newApp whose middleware acquires entries taken from an
// issue.
func newIssuingApp(t *testing.T) *app {
	t.Helper()
	a := newApp(t)
	a.store = &dying{Store: issuing{a.db.store}}
	m, err := idem.New(a.store, idem.WithLease(time.Minute), idem.WithTTL(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := m.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	})
	a.m = m
	return a
}

// TestFenceIssued: Fence works on an entry taken from an issue as on any
// other. Committed, the entry is never issued again: the middleware's
// Release after a failure leaves it committed, Issue finds it, and a
// retry gets ErrNotReplayable. Rolled back, it is the issued-origin entry
// in flight again, which the Release makes issued again, and a retry
// runs the handler.
func TestFenceIssued(t *testing.T) {
	t.Run("committed", func(t *testing.T) {
		a := newIssuingApp(t)
		ctx := context.Background()
		var info idem.Info
		w := a.serve("k", func(hctx context.Context) error {
			info, _ = idem.FromContext(hctx)
			if err := a.order(hctx, nil, commit); err != nil {
				t.Errorf("order: %v", err)
			}
			return errors.New("the handler failed after its commit")
		})
		if w.Code != http.StatusInternalServerError {
			t.Fatalf("first: %d %q", w.Code, w.Body)
		}
		key := info.StorageKey
		if s := a.state(key); s != "committed" {
			t.Fatalf("entry %q after the middleware released it, want committed", s)
		}
		if err := a.db.store.Release(ctx, key, info.Owner); err != nil {
			t.Fatalf("Release resent by the owner: %v", err)
		}
		if s := a.state(key); s != "committed" {
			t.Fatalf("entry %q after a second Release, want committed", s)
		}
		if err := a.db.store.Issue(ctx, key, time.Hour); !errors.Is(err, storage.ErrExists) {
			t.Fatalf("Issue of a committed entry: %v, want ErrExists", err)
		}
		wantNotReplayable(t, must(a.db.store.AcquireIssued(ctx, key, "o2", "fp", time.Minute)))
		wantNotReplayable409(t, a.serve("k", func(context.Context) error { return nil }))
		if n, runs := a.ordersCount(), a.runs.Load(); n != 1 || runs != 1 {
			t.Fatalf("%d orders, %d runs, want 1 and 1", n, runs)
		}
	})
	t.Run("rolled back", func(t *testing.T) {
		a := newIssuingApp(t)
		var key string
		w := a.serve("k", func(hctx context.Context) error {
			info, _ := idem.FromContext(hctx)
			key = info.StorageKey
			if err := a.order(hctx, nil, rollback); err != nil {
				t.Errorf("order: %v", err)
			}
			if s := a.state(key); s != "processing" {
				t.Errorf("entry %q after the rollback, want processing", s)
			}
			return errors.New("the handler failed")
		})
		if w.Code != http.StatusInternalServerError {
			t.Fatalf("first: %d %q", w.Code, w.Body)
		}
		if s := a.state(key); s != "issued" {
			t.Fatalf("entry %q after the middleware released it, want issued", s)
		}
		if w := a.serve("k", func(ctx context.Context) error { return a.order(ctx, nil, commit) }); w.Code != http.StatusCreated {
			t.Fatalf("retry: %d %q", w.Code, w.Body)
		}
		if n, runs := a.ordersCount(), a.runs.Load(); n != 1 || runs != 2 {
			t.Fatalf("%d orders, %d runs, want 1 and 2", n, runs)
		}
		if s := a.state(key); s != "done" {
			t.Fatalf("entry %q after the retry, want done", s)
		}
	})
}

func (a *app) ordersCount() int {
	a.t.Helper()
	var n int
	if err := a.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+a.orders).Scan(&n); err != nil {
		a.t.Fatal(err)
	}
	return n
}

// storageKey returns the only key of the store's table.
func (a *app) storageKey() string {
	a.t.Helper()
	var k []byte
	if err := a.pool.QueryRow(context.Background(), "SELECT key FROM "+a.ident()).Scan(&k); err != nil {
		a.t.Fatalf("the store's only key: %v", err)
	}
	return string(k)
}

// wantNotReplayable checks that res is what Acquire answers for a
// committed entry whose lease has run out.
func wantNotReplayable(t *testing.T, res storage.Result) {
	t.Helper()
	if res.State != storage.Committed || res.Record != nil || res.Fingerprint == "" {
		t.Fatalf("Acquire: %+v, want committed, with a fingerprint and no record", res)
	}
}

// wantConflict409 checks a 409 ErrNotReplayable answer.
func wantNotReplayable409(t *testing.T, w *httptest.ResponseRecorder) {
	t.Helper()
	if w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "#ErrNotReplayable") {
		t.Fatalf("retry: %d %q, want 409 ErrNotReplayable", w.Code, w.Body)
	}
}

// TestFenceThenDied (a): the handler commits its order with the fence,
// and the process dies before the response is stored. While the lease of
// the execution that committed runs, a retry gets the 409 of a request in
// flight (with Retry-After: the execution may still store its response);
// once it has passed, 409 ErrNotReplayable; it never runs the handler.
// Another owner's Acquire finds the entry in flight, then done, not
// replayable.
func TestFenceThenDied(t *testing.T) {
	a := newApp(t)
	ctx := context.Background()
	w := a.serve("k1", func(ctx context.Context) error {
		err := a.order(ctx, nil, commit)
		a.store.died.Store(true) // kill -9 after the commit
		return err
	})
	if w.Code != http.StatusCreated {
		t.Fatalf("first: %d %q", w.Code, w.Body)
	}
	a.store.died.Store(false) // another process, same database
	key := a.storageKey()
	if s := a.state(key); s != "committed" {
		t.Fatalf("entry %q after the commit, want committed", s)
	}
	if res := must(a.store.Acquire(ctx, key, "another owner", "fp", time.Minute)); res.State != storage.InFlight ||
		res.LeaseLeft <= 0 || res.LeaseLeft > time.Minute {
		t.Fatalf("Acquire within the lease: %v, lease left %v; want in flight, within a minute", res.State, res.LeaseLeft)
	}
	if w := a.serve("k1", func(context.Context) error { return nil }); w.Code != http.StatusConflict ||
		w.Header().Get("Retry-After") == "" || strings.Contains(w.Body.String(), "#ErrNotReplayable") {
		t.Fatalf("retry within the lease: %d %q Retry-After %q, want 409 in flight", w.Code, w.Body, w.Header().Get("Retry-After"))
	}
	a.shift(2 * time.Minute) // the lease (a minute) has passed
	wantNotReplayable(t, must(a.store.Acquire(ctx, key, "another owner", "fp", time.Minute)))
	wantNotReplayable409(t, a.serve("k1", func(context.Context) error { return nil }))
	if n, runs := a.ordersCount(), a.runs.Load(); n != 1 || runs != 1 {
		t.Fatalf("%d orders, %d runs of the handler, want 1 and 1", n, runs)
	}
	// The committed entry lives for the TTL, and then the key is free.
	a.shift(time.Hour)
	if res := must(a.store.Acquire(ctx, key, "after the TTL", "fp", time.Minute)); res.State != storage.Acquired {
		t.Fatalf("after the TTL: %v, want acquired", res.State)
	}
}

func must(res storage.Result, err error) storage.Result {
	if err != nil {
		panic(err)
	}
	return res
}

// TestFenceLeaseLost (b): an execution whose lease ran out cannot commit:
// Fence returns ErrNotOwner, the handler rolls back, and no order exists.
func TestFenceLeaseLost(t *testing.T) {
	for _, c := range []struct {
		name string
		lose func(a *app, key string)
	}{
		{"expired", func(a *app, key string) { a.shift(2 * time.Minute) }},
		{"taken by another owner", func(a *app, key string) {
			a.shift(2 * time.Minute)
			if res := must(a.store.Acquire(context.Background(), key, "o2", "fp", time.Minute)); res.State != storage.Acquired {
				t.Fatalf("another owner after the lease: %v", res.State)
			}
		}},
		{"taken and completed", func(a *app, key string) {
			a.shift(2 * time.Minute)
			a.store.Acquire(context.Background(), key, "o2", "fp", time.Minute)
			if err := a.store.Complete(context.Background(), key, "o2", []byte("r"), time.Hour); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := newApp(t)
			var fenceErr error
			a.serve("k", func(ctx context.Context) error {
				info, _ := idem.FromContext(ctx)
				c.lose(a, info.StorageKey)
				fenceErr = a.order(ctx, nil, commit)
				return fenceErr
			})
			if !errors.Is(fenceErr, storage.ErrNotOwner) {
				t.Fatalf("Fence after the lease was lost: %v, want ErrNotOwner", fenceErr)
			}
			if n := a.ordersCount(); n != 0 {
				t.Fatalf("%d orders committed by an execution that lost its lease", n)
			}
		})
	}
}

// TestFenceHoldsAcquire (c): while the handler's transaction holds the
// fence, an Acquire of the key by another owner answers at once, in
// flight, with the lease the row shows (at least 1 ms once it has run
// out during the transaction), without waiting for the transaction. Once
// it has ended, Acquire finds the entry committed (commit) or as it was
// (rollback): in flight while the lease runs, and once it has run out,
// done and not replayable (commit) or free (rollback). The process dies
// as the transaction ends, so that what the Acquire reads is the
// transaction's doing, not the middleware's Complete.
func TestFenceHoldsAcquire(t *testing.T) {
	for _, c := range []struct {
		name   string
		lease  time.Duration
		end    func(pgx.Tx) error
		want   storage.State
		orders int
	}{
		{"commit", time.Minute, commit, storage.InFlight, 1},
		{"commit after the lease ran out", 300 * time.Millisecond, commit, storage.Committed, 1},
		{"rollback", time.Minute, rollback, storage.InFlight, 0},
		{"rollback after the lease ran out", 300 * time.Millisecond, rollback, storage.Acquired, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			// The handler fences in its lease, which the middleware
			// renews on a real clock (lease/3): on a loaded machine a
			// renewal of a short lease may come too late and the Fence
			// be refused. The test sees it (leaseLog) and tries again
			// with a longer lease.
			inTime(t, c.lease, func(lease time.Duration) bool {
				a := newApp(t, idem.WithLease(lease))
				log := &leaseLog{Store: slowclock.Store{Store: a.store.Store}}
				a.store.Store = log
				ctx := context.Background()
				var key string
				var fenceErr error
				var fenced time.Time
				w := a.serve("k", func(hctx context.Context) error {
					info, _ := idem.FromContext(hctx)
					key = info.StorageKey
					fenceErr = a.order(hctx, func() {
						// The fence is in place; the transaction is open.
						expires := a.expires(key) // the committed version is not visible yet
						if lease < time.Minute {
							a.waitClock(expires)
						}
						res := prompt(t, "Acquire of the fenced key", func() result {
							return result(must2(a.db.store.Acquire(ctx, key, "o2", "fp", time.Minute)))
						})
						if res.err != nil || res.State != storage.InFlight || res.LeaseLeft < time.Millisecond || res.LeaseLeft > lease ||
							(lease < time.Minute && res.LeaseLeft != time.Millisecond) {
							t.Errorf("Acquire while the fence's transaction is open: %+v, %v; want in flight, with the lease left (1 ms once run out)", res.Result, res.err)
						}
					}, func(tx pgx.Tx) error {
						// The process dies as the transaction ends: no
						// Complete or Release of the middleware's reaches
						// the entry before the Acquire below reads it.
						err := c.end(tx)
						a.store.died.Store(true)
						return err
					})
					fenced = time.Now()
					return fenceErr
				})
				if w.Code != http.StatusCreated {
					if errors.Is(fenceErr, storage.ErrNotOwner) && log.lapsed(lease, fenced) {
						return false
					}
					t.Fatalf("the handler: %d %q", w.Code, w.Body)
				}
				res := must(a.db.store.Acquire(ctx, key, "o3", "fp", time.Minute))
				if res.State != c.want {
					t.Fatalf("Acquire after %s: %v, want %v", c.name, res.State, c.want)
				}
				if c.want == storage.Committed {
					wantNotReplayable(t, res)
				}
				if n := a.ordersCount(); n != c.orders {
					t.Fatalf("%d orders, want %d", n, c.orders)
				}
				return true
			})
		})
	}
}

// result is what a store call answered.
type result struct {
	storage.Result
	err error
}

func must2(res storage.Result, err error) result { return result{res, err} }

// prompt runs f and returns its answer, or fails the test when it has not
// answered within 10 s (a liveness bound: the store waits on a lock).
func prompt[T any](t *testing.T, what string, f func() T) T {
	t.Helper()
	c := make(chan T, 1)
	go func() { c <- f() }()
	select {
	case v := <-c:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not answer within 10 s while the fenced transaction was open", what)
	}
	panic("unreachable")
}

// openTx is a request whose handler inserts an order, fences, and keeps
// its transaction open until finish.
type openTx struct {
	info idem.Info
	fp   string // the entry's fingerprint
	endc chan func(pgx.Tx) error
	once sync.Once
	done chan struct{} // closed when the request has been served
	w    *httptest.ResponseRecorder
}

// fenceOpen serves a request with key in the background and returns once
// its handler has fenced, the transaction still open. The test's end
// rolls it back, unless finish ended it.
func (a *app) fenceOpen(key string) *openTx {
	a.t.Helper()
	o := &openTx{endc: make(chan func(pgx.Tx) error), done: make(chan struct{})}
	fenced := make(chan idem.Info, 1)
	go func() {
		defer close(o.done)
		o.w = a.serve(key, func(ctx context.Context) error {
			var end func(pgx.Tx) error
			return a.order(ctx, func() {
				info, _ := idem.FromContext(ctx)
				fenced <- info
				end = <-o.endc
			}, func(tx pgx.Tx) error { return end(tx) })
		})
	}()
	a.t.Cleanup(func() { o.finish(rollback) })
	select {
	case o.info = <-fenced:
	case <-o.done:
		a.t.Fatalf("the handler did not fence: %d %q", o.w.Code, o.w.Body)
	}
	var fp []byte
	if err := a.pool.QueryRow(context.Background(), "SELECT fingerprint FROM "+a.ident()+" WHERE key = $1", []byte(o.info.StorageKey)).Scan(&fp); err != nil {
		a.t.Fatal(err)
	}
	o.fp = string(fp)
	return o
}

// open tells whether the transaction is still open.
func (o *openTx) open() bool {
	select {
	case <-o.done:
		return false
	default:
		return true
	}
}

// finish ends the transaction with end (the first call only) and returns
// the response once the request has been served.
func (o *openTx) finish(end func(pgx.Tx) error) *httptest.ResponseRecorder {
	o.once.Do(func() { o.endc <- end })
	<-o.done
	return o.w
}

// TestFenceOpenAnswersAtOnce: while a fenced transaction is open, on a
// pool of 4 connections (one of them the transaction's), 8 Acquire of the
// key by other owners, an AcquireIssued, and a duplicate request through
// the middleware all answer at once, in flight with the lease left (409
// ErrConflict with Retry-After), instead of each waiting on the row lock
// with a connection of the pool; an Acquire of another key gets a
// connection and succeeds meanwhile; the owner's Extend (the heartbeat)
// answers at once with an error that is not ErrNotOwner. Then the
// transaction commits and the response is stored and replayed.
func TestFenceOpenAnswersAtOnce(t *testing.T) {
	pool := testPool(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 4 })
	a := newAppOn(t, pool, nil)
	ctx := context.Background()
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait) // after the transaction's end (cleanups run last first)
	o := a.fenceOpen("k")
	key, fp := o.info.StorageKey, o.fp

	type answer struct {
		what string
		res  storage.Result
		err  error
	}
	answers := make(chan answer, 16)
	http409 := make(chan *httptest.ResponseRecorder, 1)
	start := make(chan struct{})
	for i := range 8 {
		wg.Go(func() {
			<-start
			owner := fmt.Sprint("dup-", i)
			res, err := a.db.store.Acquire(ctx, key, owner, fp, time.Minute)
			answers <- answer{"Acquire by " + owner, res, err}
		})
	}
	wg.Go(func() {
		<-start
		res, err := a.db.store.AcquireIssued(ctx, key, "dup-issued", fp, time.Minute)
		answers <- answer{"AcquireIssued by another owner", res, err}
	})
	wg.Go(func() {
		<-start
		res, err := a.db.store.Acquire(ctx, "another key", "o", "fp", time.Minute)
		answers <- answer{"Acquire of another key", res, err}
	})
	wg.Go(func() {
		<-start
		err := a.db.store.Extend(ctx, key, o.info.Owner, time.Minute)
		answers <- answer{"Extend by the owner", storage.Result{}, err}
	})
	wg.Go(func() {
		<-start
		http409 <- a.serve("k", func(context.Context) error {
			t.Error("the duplicate request ran the handler")
			return nil
		})
	})
	close(start)
	bound := time.NewTimer(10 * time.Second)
	defer bound.Stop()
	const calls = 11
	for n := 0; n < calls; n++ {
		var ans answer
		select {
		case ans = <-answers:
		case <-bound.C:
			t.Fatalf("%d of %d store calls answered within 10 s while the fenced transaction was open", n, calls)
		}
		switch {
		case ans.what == "Acquire of another key":
			if ans.err != nil || ans.res.State != storage.Acquired {
				t.Errorf("%s: %+v, %v; want acquired", ans.what, ans.res, ans.err)
			}
		case ans.what == "Extend by the owner":
			if ans.err == nil || errors.Is(ans.err, storage.ErrNotOwner) || !errors.Is(ans.err, pgstore.ErrLocked) {
				t.Errorf("%s during its open transaction: %v; want ErrLocked, not ErrNotOwner", ans.what, ans.err)
			}
		default:
			if ans.err != nil || ans.res.State != storage.InFlight || ans.res.Fingerprint != fp ||
				ans.res.LeaseLeft <= 0 || ans.res.LeaseLeft > time.Minute {
				t.Errorf("%s: %+v, %v; want in flight with the lease left", ans.what, ans.res, ans.err)
			}
		}
	}
	select {
	case w := <-http409:
		if w.Code != http.StatusConflict || w.Header().Get("Retry-After") == "" || !strings.Contains(w.Body.String(), "#ErrConflict") {
			t.Errorf("duplicate request during the open transaction: %d %q Retry-After %q; want 409 ErrConflict with Retry-After",
				w.Code, w.Body, w.Header().Get("Retry-After"))
		}
	case <-bound.C:
		t.Fatal("the duplicate request was not answered within 10 s while the fenced transaction was open")
	}
	if !o.open() {
		t.Fatal("the transaction ended before the calls answered")
	}
	if w := o.finish(commit); w.Code != http.StatusCreated {
		t.Fatalf("the first request: %d %q", w.Code, w.Body)
	}
	if w := a.serve("k", func(context.Context) error { return nil }); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry after the commit: %d %q, want the stored 201 replayed", w.Code, w.Body)
	}
	if n, runs := a.ordersCount(), a.runs.Load(); n != 1 || runs != 1 {
		t.Fatalf("%d orders, %d runs, want 1 and 1", n, runs)
	}
}

// TestFenceOpenPastLease: a fenced transaction stays open after the lease
// it fenced with has run out (the heartbeat cannot renew it meanwhile).
// Every statement of the store answers at once: Acquire and AcquireIssued
// in flight with 1 ms left, Issue ErrExists, and Extend, Complete and
// Release by the owner ErrLocked (retried by the middleware), by another
// owner what they answer anyway. The transaction commits; the
// middleware's Complete then stores the response.
func TestFenceOpenPastLease(t *testing.T) {
	pool := testPool(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 4 })
	clock, advance := frozenClock(t, pool)
	a := newAppOn(t, pool, []pgstore.Option{pgstore.WithClock(clock)})
	ctx := context.Background()
	o := a.fenceOpen("k")
	key, owner, s := o.info.StorageKey, o.info.Owner, a.db.store
	advance(2 * time.Minute) // the lease, a minute, has run out
	for _, acq := range []struct {
		name string
		f    func(context.Context, string, string, string, time.Duration) (storage.Result, error)
	}{{"Acquire", s.Acquire}, {"AcquireIssued", s.AcquireIssued}} {
		res := prompt(t, acq.name, func() result { return must2(acq.f(ctx, key, "o2", "fp", time.Minute)) })
		if res.err != nil || res.State != storage.InFlight || res.Fingerprint != o.fp || res.LeaseLeft != time.Millisecond {
			t.Errorf("%s: %+v, %v; want in flight with %q and 1 ms left", acq.name, res.Result, res.err, o.fp)
		}
	}
	if err := prompt(t, "Issue", func() error { return s.Issue(ctx, key, time.Hour) }); !errors.Is(err, storage.ErrExists) {
		t.Errorf("Issue: %v, want ErrExists", err)
	}
	// The owner's calls: ErrLocked. Another owner's: what they answer
	// anyway (the row is not theirs): ErrNotOwner, and nil for Release
	// (the lease of the row they see has run out: nothing of theirs is
	// held).
	for _, op := range []struct {
		name  string
		f     func(who string) error
		other error
	}{
		{"Extend", func(who string) error { return s.Extend(ctx, key, who, time.Minute) }, storage.ErrNotOwner},
		{"Complete", func(who string) error { return s.Complete(ctx, key, who, []byte("r"), time.Hour) }, storage.ErrNotOwner},
		{"Release", func(who string) error { return s.Release(ctx, key, who) }, nil},
	} {
		if err := prompt(t, op.name+" by the owner", func() error { return op.f(owner) }); !errors.Is(err, pgstore.ErrLocked) || errors.Is(err, storage.ErrNotOwner) {
			t.Errorf("%s by the owner: %v, want ErrLocked", op.name, err)
		}
		if err := prompt(t, op.name+" by another owner", func() error { return op.f("o2") }); !errors.Is(err, op.other) || errors.Is(err, pgstore.ErrLocked) {
			t.Errorf("%s by another owner: %v, want %v", op.name, err, op.other)
		}
	}
	if res := prompt(t, "Acquire of another key", func() result { return must2(s.Acquire(ctx, "another key", "o", "fp", time.Minute)) }); res.err != nil || res.State != storage.Acquired {
		t.Errorf("Acquire of another key: %+v, %v", res.Result, res.err)
	}
	if !o.open() {
		t.Fatal("the transaction ended before the calls answered")
	}
	if w := o.finish(commit); w.Code != http.StatusCreated {
		t.Fatalf("the first request: %d %q", w.Code, w.Body)
	}
	if res := must(s.Acquire(ctx, key, "o3", "fp", time.Minute)); res.State != storage.Done || res.Fingerprint != o.fp {
		t.Fatalf("after the commit: %+v, want done, the response stored", res)
	}
	if w := a.serve("k", func(context.Context) error { return nil }); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry after the commit: %d %q, want the stored 201 replayed", w.Code, w.Body)
	}
}

// expires returns the expiry of key's row, as a statement outside the
// fence's transaction sees it.
func (a *app) expires(key string) time.Time {
	a.t.Helper()
	var t time.Time
	if err := a.pool.QueryRow(context.Background(), "SELECT expires FROM "+a.ident()+" WHERE key = $1", []byte(key)).Scan(&t); err != nil {
		a.t.Fatal(err)
	}
	return t
}

// waitClock waits until the database's clock has passed t.
func (a *app) waitClock(t time.Time) {
	a.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var passed bool
		if err := a.pool.QueryRow(context.Background(), "SELECT clock_timestamp() > $1", t).Scan(&passed); err != nil {
			a.t.Fatal(err)
		}
		if passed {
			return
		}
		if time.Now().After(deadline) {
			a.t.Fatal("the database's clock did not pass the lease's end")
		}
		time.Sleep(5 * time.Millisecond) // a real lease: real time
	}
}

// TestFenceThenNotStored (d): after a committed fence, the handler fails
// (an error status, which the middleware does not store, or a panic) and
// the middleware releases the key: the entry stays committed, and a retry
// gets 409 ErrNotReplayable, never a second order. The owner may still
// extend (a no-op) and complete it.
func TestFenceThenNotStored(t *testing.T) {
	for _, c := range []struct {
		name  string
		after func()
	}{
		{"error status", func() {}},
		{"panic", func() { panic("after the commit") }},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := newApp(t)
			ctx := context.Background()
			var info idem.Info
			func() {
				defer func() { recover() }()
				a.serve("k", func(hctx context.Context) error {
					info, _ = idem.FromContext(hctx)
					if err := a.order(hctx, nil, commit); err != nil {
						t.Errorf("order: %v", err)
					}
					c.after()
					return errors.New("the handler failed after its commit")
				})
			}()
			key := info.StorageKey
			if s := a.state(key); s != "committed" {
				t.Fatalf("entry %q after the middleware released it, want committed", s)
			}
			wantNotReplayable409(t, a.serve("k", func(context.Context) error { return nil }))
			// The owner's own calls.
			if err := a.store.Extend(ctx, key, info.Owner, time.Minute); err != nil {
				t.Errorf("Extend by the owner of a committed entry: %v", err)
			}
			if err := a.store.Release(ctx, key, info.Owner); err != nil {
				t.Errorf("Release by the owner of a committed entry: %v", err)
			}
			if err := a.store.Release(ctx, key, "o2"); !errors.Is(err, storage.ErrNotOwner) {
				t.Errorf("Release of a committed entry by another owner: %v", err)
			}
			if err := a.store.Extend(ctx, key, "o2", time.Minute); !errors.Is(err, storage.ErrNotOwner) {
				t.Errorf("Extend of a committed entry by another owner: %v", err)
			}
			if err := a.store.Complete(ctx, key, "o2", []byte("r"), time.Hour); !errors.Is(err, storage.ErrNotOwner) {
				t.Errorf("Complete of a committed entry by another owner: %v", err)
			}
			if s := a.state(key); s != "committed" {
				t.Fatalf("entry %q, want committed", s)
			}
			if err := a.store.Complete(ctx, key, info.Owner, []byte("record"), time.Hour); err != nil {
				t.Fatalf("Complete by the owner of a committed entry: %v", err)
			}
			if res := must(a.store.Acquire(ctx, key, "o3", "fp", time.Minute)); res.State != storage.Done || string(res.Record) != "record" {
				t.Fatalf("after Complete: %v %q, want done with the record", res.State, res.Record)
			}
			if n, runs := a.ordersCount(), a.runs.Load(); n != 1 || runs != 1 {
				t.Fatalf("%d orders, %d runs, want 1 and 1", n, runs)
			}
		})
	}
}

// TestFenceTwice: the same execution may fence again, in the same or a
// later transaction.
func TestFenceTwice(t *testing.T) {
	a := newApp(t)
	w := a.serve("k", func(ctx context.Context) error {
		for range 2 {
			if err := a.order(ctx, func() {}, func(tx pgx.Tx) error {
				if err := a.store.Fence(ctx, tx); err != nil {
					return fmt.Errorf("second Fence in the transaction: %w", err)
				}
				return tx.Commit(ctx)
			}); err != nil {
				return err
			}
		}
		return nil
	})
	if w.Code != http.StatusCreated || a.ordersCount() != 2 {
		t.Fatalf("%d %q, %d orders", w.Code, w.Body, a.ordersCount())
	}
}

// TestFenceUnprotected (e): without the middleware's protection Fence does
// nothing, sends nothing, and the transaction commits as it would without
// idem.
func TestFenceUnprotected(t *testing.T) {
	t.Run("no Info", func(t *testing.T) {
		var c counter
		pool := testPool(t, c.Configure)
		d := openOn(t, pool)
		tx, err := pool.Begin(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(context.Background())
		c.Reset()
		if err := d.store.Fence(context.Background(), tx); err != nil || c.Statements() != 0 {
			t.Fatalf("Fence outside the middleware: %v, %d statements; want nil and none", err, c.Statements())
		}
	})
	t.Run("no key", func(t *testing.T) {
		a := newApp(t)
		if w := a.serve("", func(ctx context.Context) error { return a.order(ctx, nil, commit) }); w.Code != http.StatusCreated {
			t.Fatalf("%d %q", w.Code, w.Body)
		}
		if n := a.ordersCount(); n != 1 {
			t.Fatalf("%d orders", n)
		}
	})
	t.Run("fail open", func(t *testing.T) {
		a := newApp(t, idem.WithFailOpen())
		a.exec("DROP TABLE {table}") // the store fails
		w := a.serve("k", func(ctx context.Context) error {
			if info, _ := idem.FromContext(ctx); info.Protected {
				t.Error("protected, with the store's table gone")
			}
			return a.order(ctx, nil, commit)
		})
		if w.Code != http.StatusCreated || a.ordersCount() != 1 {
			t.Fatalf("%d %q, %d orders", w.Code, w.Body, a.ordersCount())
		}
		// The store comes back: the release the failed Acquire left
		// retrying goes through, and Shutdown (at cleanup) need not wait
		// for the lease to run out.
		if err := a.db.store.CreateTable(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

// TestFenceClockNotTransactionStart: the lease is judged by the clock when
// Fence runs, not when the transaction began (now()): a lease that ran
// out while the transaction was open cannot commit.
func TestFenceClockNotTransactionStart(t *testing.T) {
	a := newApp(t, idem.WithLease(150*time.Millisecond))
	var fenceErr error
	a.serve("k", func(ctx context.Context) error {
		info, _ := idem.FromContext(ctx)
		tx, err := a.pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(context.Background())
		if _, err := tx.Exec(ctx, "INSERT INTO "+a.orders+" (owner) VALUES ($1)", info.Owner); err != nil {
			return err
		}
		a.store.died.Store(true) // no more renewals of the lease
		for {
			// A renewal sent before may still land: wait until the lease's
			// end stands still and has passed.
			end := a.expires(info.StorageKey)
			a.waitClock(end)
			if a.expires(info.StorageKey).Equal(end) {
				break
			}
		}
		if fenceErr = a.store.Fence(ctx, tx); fenceErr != nil {
			return fenceErr
		}
		return tx.Commit(ctx)
	})
	if !errors.Is(fenceErr, storage.ErrNotOwner) {
		t.Fatalf("Fence after the lease ran out during the transaction: %v, want ErrNotOwner", fenceErr)
	}
	if n := a.ordersCount(); n != 0 {
		t.Fatalf("%d orders", n)
	}
}

// TestFenceCommittedLease: a committed entry keeps the lease of the
// execution that committed it. Acquire finds it in flight while that lease
// runs; the owner's Extend renews it; the owner's Release ends it, after
// which Acquire finds it done and not replayable, and Extend does not
// bring it back; the owner's Complete still stores the response, which a
// retry then replays.
func TestFenceCommittedLease(t *testing.T) {
	a := newApp(t)
	ctx := context.Background()
	left := func(key string) (storage.State, time.Duration) {
		res := must(a.store.Acquire(ctx, key, "o2", "fp", time.Minute))
		return res.State, res.LeaseLeft
	}
	w := a.serve("k", func(hctx context.Context) error {
		if err := a.order(hctx, nil, commit); err != nil {
			return err
		}
		info, _ := idem.FromContext(hctx)
		key := info.StorageKey
		if st, d := left(key); st != storage.InFlight || d <= 0 || d > time.Minute {
			t.Errorf("after the commit: %v, lease left %v; want in flight, within a minute", st, d)
		}
		a.shift(40 * time.Second)
		if st, d := left(key); st != storage.InFlight || d > 20*time.Second {
			t.Errorf("40s later: %v, lease left %v; want in flight, at most 20s", st, d)
		}
		if err := a.store.Extend(ctx, key, info.Owner, time.Minute); err != nil {
			t.Errorf("Extend by the owner: %v", err)
		}
		if st, d := left(key); st != storage.InFlight || d <= 20*time.Second {
			t.Errorf("after Extend: %v, lease left %v; want in flight, more than 20s", st, d)
		}
		if err := a.store.Release(ctx, key, info.Owner); err != nil {
			t.Errorf("Release by the owner: %v", err)
		}
		wantNotReplayable(t, must(a.store.Acquire(ctx, key, "o2", "fp", time.Minute)))
		if err := a.store.Extend(ctx, key, info.Owner, time.Minute); err != nil {
			t.Errorf("Extend by the owner after Release: %v", err)
		}
		wantNotReplayable(t, must(a.store.Acquire(ctx, key, "o2", "fp", time.Minute)))
		if s := a.state(key); s != "committed" {
			t.Errorf("entry %q, want committed", s)
		}
		return nil
	})
	if w.Code != http.StatusCreated {
		t.Fatalf("first: %d %q", w.Code, w.Body)
	}
	r := a.serve("k", func(context.Context) error { return nil })
	if r.Code != http.StatusCreated || r.Header().Get("Idempotent-Replayed") != "true" || a.runs.Load() != 1 {
		t.Fatalf("retry: %d %q replayed %q, %d runs; want the stored 201, 1 run", r.Code, r.Body, r.Header().Get("Idempotent-Replayed"), a.runs.Load())
	}
}
