package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/response"
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
	pool := pgtest.Pool(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 8 })
	a := &app{db: openOn(t, pool)}
	orders := pgtest.Table(t, pool)
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
	a.m.Serve(w, r, "/orders", func(w http.ResponseWriter, r *http.Request, _ *response.Capture) {
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

// wantNotReplayable checks that res is done with the record Acquire gives
// a committed entry.
func wantNotReplayable(t *testing.T, res storage.Result) {
	t.Helper()
	var rec response.Record
	if res.State != storage.Done {
		t.Fatalf("Acquire: %v, want done", res.State)
	}
	if err := rec.UnmarshalBinary(res.Record); err != nil || !rec.NotReplayable || rec.Status != 0 {
		t.Fatalf("record %+v (%v), want NotReplayable with status 0", rec, err)
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
// fence, an Acquire of the key by another owner waits for it to end; then
// it finds the entry committed (commit) or as it was (rollback): in flight
// while the lease runs, and once it has run out during the wait, done and
// not replayable (commit) or free (rollback). The process dies as the
// transaction ends, so that what the Acquire reads is the transaction's
// doing, not the middleware's Complete, which would otherwise race it.
func TestFenceHoldsAcquire(t *testing.T) {
	for _, c := range []struct {
		name   string
		lease  time.Duration
		end    func(pgx.Tx) error
		want   storage.State
		orders int
	}{
		{"commit", time.Minute, commit, storage.InFlight, 1},
		{"commit after the lease ran out", 300 * time.Millisecond, commit, storage.Done, 1},
		{"rollback", time.Minute, rollback, storage.InFlight, 0},
		{"rollback after the lease ran out", 300 * time.Millisecond, rollback, storage.Acquired, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := newApp(t, idem.WithLease(c.lease))
			ctx := context.Background()
			got := make(chan storage.Result, 1)
			w := a.serve("k", func(hctx context.Context) error {
				info, _ := idem.FromContext(hctx)
				return a.order(hctx, func() {
					// The fence is in place; the transaction is open.
					expires := a.expires(info.StorageKey) // the committed version is not visible yet
					go func() {
						res, err := a.store.Acquire(ctx, info.StorageKey, "o2", "fp", time.Minute)
						if err != nil {
							t.Errorf("Acquire: %v", err)
						}
						got <- res
					}()
					a.waitLocked()
					if c.lease < time.Minute {
						a.waitClock(expires)
					}
					select {
					case res := <-got:
						t.Errorf("Acquire answered %v while the fence's transaction was open", res.State)
					default:
					}
				}, func(tx pgx.Tx) error {
					// The process dies as the transaction ends: no
					// Complete or Release of the middleware's can reach
					// the entry before the waiting Acquire reads it.
					err := c.end(tx)
					a.store.died.Store(true)
					return err
				})
			})
			if w.Code != http.StatusCreated {
				t.Fatalf("the handler: %d %q", w.Code, w.Body)
			}
			var res storage.Result
			select {
			case res = <-got:
			case <-time.After(10 * time.Second):
				t.Fatal("Acquire still waiting 10s after the transaction ended")
			}
			if res.State != c.want {
				t.Fatalf("Acquire after %s: %v, want %v", c.name, res.State, c.want)
			}
			if c.want == storage.Done {
				wantNotReplayable(t, res)
			}
			if n := a.ordersCount(); n != c.orders {
				t.Fatalf("%d orders, want %d", n, c.orders)
			}
		})
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

// waitLocked waits until a statement on the store's table waits for a
// lock, or fails the test after ten seconds.
func (a *app) waitLocked() {
	a.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		err := a.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND position($1 in query) > 0`, a.table).Scan(&n)
		if err != nil {
			a.t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			a.t.Fatal("no statement on the table waits for the fence's lock after 10s")
		}
		time.Sleep(2 * time.Millisecond) // another session: polled
	}
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
		var c pgtest.Counter
		pool := pgtest.Pool(t, c.Configure)
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
