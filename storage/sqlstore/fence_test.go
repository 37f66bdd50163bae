package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/sqlstore"
)

// prompt runs f and returns its answer, or fails the test when it has not
// answered within 10 s: a liveness bound, far below the server's
// innodb_lock_wait_timeout of 50 s (MySQL), or no lock_timeout at all
// (PostgreSQL), that a statement waiting on the fenced row would take.
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

// fenceTx acquires key for owner with lease, begins a transaction and
// fences in it; the test's end rolls it back unless the caller ended it.
func fenceTx(t *testing.T, db *sql.DB, s *sqlstore.Store, key, owner string, lease time.Duration) *sql.Tx {
	t.Helper()
	tx, ok := tryFenceTx(t, db, s, key, owner, lease)
	if !ok {
		t.Fatalf("Fence: refused, %v after the Acquire: the lease had run out", lease)
	}
	return tx
}

// tryFenceTx is fenceTx, which reports false (the transaction rolled
// back) when the Fence was refused (ErrNotOwner) at least lease after the
// Acquire was sent: on a loaded machine, where the lease may have run
// out on the server's clock in between.
func tryFenceTx(t *testing.T, db *sql.DB, s *sqlstore.Store, key, owner string, lease time.Duration) (*sql.Tx, bool) {
	t.Helper()
	ctx := context.Background()
	sent := time.Now()
	if res, err := s.Acquire(ctx, key, owner, "fp-"+owner, lease); err != nil || res.State != storage.Acquired {
		t.Fatalf("Acquire: %+v, %v", res, err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback() })
	if err := s.Fence(storage.ContextWithLease(ctx, storage.Lease{Key: key, Owner: owner, TTL: time.Hour}), tx); err != nil {
		if errors.Is(err, storage.ErrNotOwner) && time.Since(sent) >= lease {
			tx.Rollback()
			return nil, false
		}
		t.Fatalf("Fence: %v", err)
	}
	return tx, true
}

// TestFenceOpenAnswersAtOnce: while a fenced transaction is open, with the
// server's innodb_lock_wait_timeout at 50 s and a pool of 4 connections
// (one of them the transaction's), 8 Acquire of the key by other owners,
// an AcquireIssued, Issue, Lookup and Remove, and the owner's Extend,
// Complete and Release all answer well within 10 s: in flight with the
// owner's fingerprint, ErrExists, the entry, ErrLocked; an Acquire of
// another key gets a connection and succeeds meanwhile. Then the
// transaction commits: the entry is committed and in flight while the
// lease runs, and the owner completes it.
func TestFenceOpenAnswersAtOnce(t *testing.T) {
	forEach(t, func(t *testing.T, b *backend) {
		db := b.testDB(t)
		b.lockWait(t, db)
		db.SetMaxOpenConns(4)
		s := open(t, db)
		ctx := context.Background()
		tx := fenceTx(t, db, s, "k", "o1", time.Minute)

		type answer struct {
			what string
			res  storage.Result
			err  error
		}
		var wg sync.WaitGroup
		answers := make(chan answer, 32)
		start := make(chan struct{})
		call := func(what string, f func() (storage.Result, error)) {
			wg.Go(func() {
				<-start
				res, err := f()
				answers <- answer{what, res, err}
			})
		}
		for i := range 8 {
			call("Acquire", func() (storage.Result, error) {
				return s.Acquire(ctx, "k", fmt.Sprint("dup-", i), "fp-o1", time.Minute)
			})
		}
		call("AcquireIssued", func() (storage.Result, error) { return s.AcquireIssued(ctx, "k", "dup-i", "fp-o1", time.Minute) })
		call("Acquire of another key", func() (storage.Result, error) { return s.Acquire(ctx, "other", "o", "fp", time.Minute) })
		call("Issue", func() (storage.Result, error) { return storage.Result{}, s.Issue(ctx, "k", time.Hour) })
		call("Extend", func() (storage.Result, error) { return storage.Result{}, s.Extend(ctx, "k", "o1", time.Minute) })
		call("Complete", func() (storage.Result, error) {
			return storage.Result{}, s.Complete(ctx, "k", "o1", []byte("r"), time.Hour)
		})
		call("Release", func() (storage.Result, error) { return storage.Result{}, s.Release(ctx, "k", "o1") })
		call("Lookup", func() (storage.Result, error) {
			e, err := s.Lookup(ctx, "k", false)
			if err == nil && e.State == storage.InFlight {
				_, err = s.Remove(ctx, "k", e.Version)
			}
			return storage.Result{State: e.State}, err
		})
		began := time.Now()
		close(start)
		bound := time.NewTimer(10 * time.Second)
		defer bound.Stop()
		const calls = 15
		for n := range calls {
			var a answer
			select {
			case a = <-answers:
			case <-bound.C:
				t.Fatalf("%d of %d store calls answered within 10 s while the fenced transaction was open", n, calls)
			}
			switch a.what {
			case "Acquire of another key":
				if a.err != nil || a.res.State != storage.Acquired {
					t.Errorf("%s: %+v, %v; want acquired", a.what, a.res, a.err)
				}
			case "Issue":
				if !errors.Is(a.err, storage.ErrExists) {
					t.Errorf("Issue: %v, want ErrExists", a.err)
				}
			case "Extend", "Complete", "Release", "Lookup":
				// Lookup reads the row as it was (in flight); Remove then
				// finds it locked.
				if !errors.Is(a.err, sqlstore.ErrLocked) || errors.Is(a.err, storage.ErrNotOwner) {
					t.Errorf("%s by the owner during its open transaction: %v; want ErrLocked", a.what, a.err)
				}
			default:
				if a.err != nil || a.res.State != storage.InFlight || a.res.Fingerprint != "fp-o1" ||
					a.res.LeaseLeft <= 0 || a.res.LeaseLeft > time.Minute {
					t.Errorf("%s: %+v, %v; want in flight with the owner's fingerprint and the lease left", a.what, a.res, a.err)
				}
			}
		}
		t.Logf("15 calls answered in %v while the fenced transaction was open", time.Since(began))
		wg.Wait()
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if st := state(t, db, "k"); st != "committed" {
			t.Fatalf("after the commit: %q, want committed", st)
		}
		if res, err := s.Acquire(ctx, "k", "o2", "fp", time.Minute); err != nil || res.State != storage.InFlight || res.Fingerprint != "fp-o1" {
			t.Fatalf("Acquire after the commit, in the lease: %+v, %v; want in flight", res, err)
		}
		if err := s.Complete(ctx, "k", "o1", []byte("response"), time.Hour); err != nil {
			t.Fatal(err)
		}
		if res, err := s.Acquire(ctx, "k", "o2", "fp", time.Minute); err != nil || res.State != storage.Done || string(res.Record) != "response" {
			t.Fatalf("Acquire after the Complete: %+v, %v; want done", res, err)
		}
	})
}

// waitServerClock waits until the server's clock has passed the expiry of
// key's row as the test's connection reads it (the row's committed
// version): a lease running out on the server's clock, which no UPDATE
// can move while the fence's transaction holds the row.
func waitServerClock(t *testing.T, db *sql.DB, key string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var past bool
		err := db.QueryRow(query(t, db, "SELECT expires < "+backendFor(t, db).now+" FROM {table} WHERE `key` = ?"), []byte(key)).Scan(&past)
		if err != nil {
			t.Fatal(err)
		}
		if past {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the lease did not run out on the server's clock within 20 s")
		}
		time.Sleep(10 * time.Millisecond) // the server's clock: nothing to wait on but time
	}
}

// TestFenceOpenPastLease: the fenced transaction stays open after the
// lease it fenced with has run out. Every statement still answers at once:
// Acquire and AcquireIssued in flight with 1 ms left, Issue ErrExists,
// the owner's Extend, Complete and Release ErrLocked, Cleanup skips the
// row. After the commit the lease is over: Committed.
func TestFenceOpenPastLease(t *testing.T) {
	forEach(t, func(t *testing.T, b *backend) {
		db := b.testDB(t)
		b.lockWait(t, db)
		s := open(t, db)
		ctx := context.Background()
		// A lease the Fence comes well within, unless the machine is
		// loaded: then again with a longer one (the test waits it out).
		var tx *sql.Tx
		for lease := time.Second; ; lease *= 4 {
			var ok bool
			if tx, ok = tryFenceTx(t, db, s, "k", "o1", lease); ok {
				break
			}
			if lease >= 4*time.Second {
				t.Skipf("the Fence came after a lease of %v had run out, twice: a loaded machine, no verdict", lease)
			}
			t.Logf("the Fence came after a lease of %v had run out (a loaded machine): trying again with %v", lease, 4*lease)
			waitServerClock(t, db, "k") // the entry is o1's to take again once its lease has run out
		}
		waitServerClock(t, db, "k")

		res := prompt(t, "Acquire", func() storage.Result {
			res, err := s.Acquire(ctx, "k", "o2", "fp", time.Minute)
			if err != nil {
				t.Error(err)
			}
			return res
		})
		if res.State != storage.InFlight || res.LeaseLeft != time.Millisecond || res.Fingerprint != "fp-o1" {
			t.Errorf("Acquire past the lease, the transaction open: %+v; want in flight, 1 ms left", res)
		}
		res = prompt(t, "AcquireIssued", func() storage.Result {
			res, err := s.AcquireIssued(ctx, "k", "o2", "fp", time.Minute)
			if err != nil {
				t.Error(err)
			}
			return res
		})
		if res.State != storage.NotIssued && res.State != storage.InFlight {
			t.Errorf("AcquireIssued past the lease: %+v", res)
		}
		if err := prompt(t, "Issue", func() error { return s.Issue(ctx, "k", time.Hour) }); !errors.Is(err, storage.ErrExists) {
			t.Errorf("Issue: %v, want ErrExists", err)
		}
		for name, f := range map[string]func() error{
			"Extend":   func() error { return s.Extend(ctx, "k", "o1", time.Minute) },
			"Complete": func() error { return s.Complete(ctx, "k", "o1", []byte("r"), time.Hour) },
			"Release":  func() error { return s.Release(ctx, "k", "o1") },
		} {
			if err := prompt(t, name, f); !errors.Is(err, sqlstore.ErrLocked) {
				t.Errorf("%s by the owner past its lease, the transaction open: %v, want ErrLocked", name, err)
			}
		}
		if _, err := prompt(t, "Cleanup", func() struct{} {
			if _, err := s.Cleanup(ctx); err != nil {
				t.Error(err)
			}
			return struct{}{}
		}), error(nil); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		res, err := s.Acquire(ctx, "k", "o3", "fp", time.Minute)
		if err != nil || res.State != storage.Committed || res.Fingerprint != "fp-o1" {
			t.Fatalf("Acquire after the commit past the lease: %+v, %v; want committed", res, err)
		}
	})
}

// TestFenceStale: an execution whose lease ran out and whose key another
// execution took cannot fence (ErrNotOwner), nor can one whose entry is
// gone; the other execution's entry is untouched.
func TestFenceStale(t *testing.T) {
	forEach(t, func(t *testing.T, b *backend) {
		db := b.testDB(t)
		s := open(t, db)
		ctx := context.Background()
		if res, err := s.Acquire(ctx, "k", "o1", "fp", time.Minute); err != nil || res.State != storage.Acquired {
			t.Fatal(res, err)
		}
		shift(t, db, time.Hour)
		if res, err := s.Acquire(ctx, "k", "o2", "fp", time.Minute); err != nil || res.State != storage.Acquired {
			t.Fatalf("Acquire after the lease: %+v, %v", res, err)
		}
		for _, c := range []struct{ key, owner string }{{"k", "o1"}, {"missing", "o1"}} {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			err = s.Fence(storage.ContextWithLease(ctx, storage.Lease{Key: c.key, Owner: c.owner, TTL: time.Hour}), tx)
			tx.Rollback()
			if !errors.Is(err, storage.ErrNotOwner) {
				t.Fatalf("Fence of %s by stale %s: %v, want ErrNotOwner", c.key, c.owner, err)
			}
		}
		if st := state(t, db, "k"); st != "processing" {
			t.Fatalf("o2's entry is %q", st)
		}
		if err := s.Complete(ctx, "k", "o2", []byte("r"), time.Hour); err != nil {
			t.Fatal(err)
		}
	})
}

// TestFenceRollback: a rolled-back fence leaves the entry processing with
// its lease: in flight for others, the owner's to complete; once the lease
// has run out, free.
func TestFenceRollback(t *testing.T) {
	forEach(t, func(t *testing.T, b *backend) {
		db := b.testDB(t)
		s := open(t, db)
		ctx := context.Background()
		tx := fenceTx(t, db, s, "k", "o1", time.Minute)
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
		if st := state(t, db, "k"); st != "processing" {
			t.Fatalf("after the rollback: %q, want processing", st)
		}
		if res, err := s.Acquire(ctx, "k", "o2", "fp", time.Minute); err != nil || res.State != storage.InFlight {
			t.Fatalf("Acquire after the rollback: %+v, %v; want in flight", res, err)
		}
		shift(t, db, time.Hour)
		if res, err := s.Acquire(ctx, "k", "o2", "fp", time.Minute); err != nil || res.State != storage.Acquired {
			t.Fatalf("Acquire after the rollback and the lease: %+v, %v; want acquired", res, err)
		}
	})
}

// TestFenceUnprotectedAndInvalid: without a Lease Fence does nothing;
// with an incomplete one it is ErrInvalid; twice in one transaction is
// fine.
func TestFenceUnprotectedAndInvalid(t *testing.T) {
	forEach(t, func(t *testing.T, b *backend) {
		db := b.testDB(t)
		s := open(t, db)
		ctx := context.Background()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if err := s.Fence(ctx, tx); err != nil {
			t.Fatalf("Fence without a lease: %v", err)
		}
		if err := s.Fence(storage.ContextWithLease(ctx, storage.Lease{Key: "k"}), tx); !errors.Is(err, storage.ErrInvalid) {
			t.Fatalf("Fence without an owner: %v", err)
		}
		tx.Rollback()
		tx = fenceTx(t, db, s, "k", "o1", time.Minute)
		if err := s.Fence(storage.ContextWithLease(ctx, storage.Lease{Key: "k", Owner: "o1", TTL: time.Hour}), tx); err != nil {
			t.Fatalf("second Fence in the transaction: %v", err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	})
}

// unreachable wraps a store whose Complete never gets through, as when the
// process loses the database right after the handler.
type unreachable struct{ storage.Store }

func (unreachable) Complete(context.Context, string, string, []byte, time.Duration) error {
	return errors.New("connection reset by peer")
}

// TestMiddlewareFence: through nethttp, a handler inserts an order and
// fences in one transaction. (1) While the transaction is open, a duplicate
// request gets 409 at once. (2) Its response never reaches the store and
// the lease ends: the retry gets 409 ErrNotReplayable, one order exists.
// Without the fence (the control) the retry runs the handler again.
func TestMiddlewareFence(t *testing.T) {
	forEach(t, func(t *testing.T, b *backend) {
		for _, c := range []struct {
			name       string
			fence      bool
			wantOrders int
			wantRetry  int
		}{
			{"with Fence", true, 1, http.StatusConflict},
			{"without Fence", false, 2, http.StatusCreated},
		} {
			t.Run(c.name, func(t *testing.T) {
				// The handler fences in the lease, and without the fence
				// the duplicate is refused in it: a lease the middleware
				// renews on a real clock (lease/3). On a loaded machine
				// a renewal may come too late, and the lease run out: the
				// test sees it (leaseLog) and tries again, on a database
				// of its own, with a longer lease.
				inTime(t, 200*time.Millisecond, func(lease time.Duration) bool {
					return testMiddlewareFence(t, b, lease, c.fence, c.wantOrders, c.wantRetry)
				})
			})
		}
	})
}

// testMiddlewareFence is an attempt of TestMiddlewareFence with lease; it
// returns false when the lease may have run out before the Fence or the
// duplicate, on a loaded machine.
func testMiddlewareFence(t *testing.T, b *backend, lease time.Duration, fence bool, wantOrders, wantRetry int) bool {
	db := b.testDB(t)
	b.lockWait(t, db)
	s := open(t, db)
	exec(t, db, b.ordersDDL)
	log := &leaseLog{Store: s}
	m, err := idem.New(unreachable{log}, idem.WithLease(lease), idem.WithTTL(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	defer m.Shutdown(ctx)
	var runs atomic.Int64
	var mu sync.Mutex // the first handler's Fence: its error, and when it returned
	var fenceErr error
	var fenced time.Time
	fenceDone := make(chan struct{}, 1)
	proceed := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		first := runs.Add(1) == 1
		if first {
			defer func() { fenceDone <- struct{}{} }() // a handler that fails unblocks the test too
		}
		ctx := r.Context()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, b.orderInsert); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		if fence {
			err := s.Fence(ctx, tx)
			if first {
				mu.Lock()
				fenceErr, fenced = err, time.Now()
				mu.Unlock()
			}
			if err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
		}
		if first {
			fenceDone <- struct{}{}
			<-proceed
		}
		if err := tx.Commit(); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":1}`)
	})
	srv := httptest.NewServer(nethttp.Middleware(m)(mux))
	defer srv.Close()
	post := func() (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", `"order-1"`)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Error(err)
			return 0, ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	first := make(chan int, 1)
	go func() { code, _ := post(); first <- code }()
	<-fenceDone
	mu.Lock()
	refused := fenceErr != nil
	late := errors.Is(fenceErr, storage.ErrNotOwner) && log.Lapsed(lease, fenced)
	mu.Unlock()
	if refused {
		<-first
		if late {
			return false
		}
		t.Fatalf("Fence in the lease: %v", fenceErr)
	}
	type reply struct {
		code int
		body string
	}
	dup := prompt(t, "a duplicate request", func() reply { code, body := post(); return reply{code, body} })
	if dup.code != http.StatusConflict {
		// Without the fence only the lease keeps the duplicate out.
		if !fence && log.Lapsed(lease, time.Now()) {
			close(proceed)
			<-first
			return false
		}
		t.Errorf("duplicate while the transaction is open: %d %s, want 409", dup.code, dup.body)
	}
	close(proceed)
	if code := <-first; code != http.StatusCreated {
		t.Fatalf("first: %d", code)
	}
	if err := m.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	shift(t, db, time.Minute) // past the lease (and the processing row's expiry, without the fence), not the TTL
	code, body := post()
	if code != wantRetry || (fence && !strings.Contains(body, "#ErrNotReplayable")) {
		t.Fatalf("retry: %d %s, want %d", code, body, wantRetry)
	}
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM orders").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != wantOrders || runs.Load() != int64(wantOrders) {
		t.Fatalf("%d orders, %d runs of the handler, want %d", n, runs.Load(), wantOrders)
	}
	if err := m.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	return true
}

// TestFenceOtherPool: Fence with a transaction of another *sql.DB on the
// same database (the package doc advises a pool of the store's own on
// PostgreSQL when the database's default isolation is not READ
// COMMITTED; here the application's pool runs REPEATABLE READ, or
// MySQL's default) works, before and after the store has prepared its
// own statement: the entry commits with the order, and a retry through
// the middleware does not run the handler again. Issue 36: database/sql
// refused the store's prepared statement for that transaction ("Tx.Stmt:
// statement from different database used"), so every fenced request
// got 500.
func TestFenceOtherPool(t *testing.T) {
	forEach(t, func(t *testing.T, b *backend) {
		storeDB := b.testDB(t)
		s := open(t, storeDB)
		params := map[string]string{}
		if b.dialect == sqlstore.PostgreSQL {
			params["default_transaction_isolation"] = "repeatable read"
		}
		app := sameDB(t, storeDB, params)
		if _, err := app.Exec(b.ordersDDL); err != nil {
			t.Fatal(err)
		}
		m, err := idem.New(s)
		if err != nil {
			t.Fatal(err)
		}
		var runs atomic.Int64
		h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			tx, err := app.BeginTx(r.Context(), nil)
			if err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			defer tx.Rollback()
			if err := s.Fence(r.Context(), tx); err != nil { // first: REPEATABLE READ wants it so
				http.Error(w, err.Error(), 500)
				return
			}
			if _, err := tx.Exec(b.orderInsert); err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			if err := tx.Commit(); err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "created")
		}))
		post := func(key string) *httptest.ResponseRecorder {
			r := httptest.NewRequest(http.MethodPost, "/orders", nil)
			r.Header.Set("Idempotency-Key", key)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			return w
		}
		// k1 before the store has prepared its fence statement; k2 after
		// a fence on the store's own pool prepared it.
		for i, key := range []string{"k1", "k2"} {
			if i == 1 {
				tx := fenceTx(t, storeDB, s, "warm-up", "o1", time.Minute)
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
			}
			if w := post(key); w.Code != http.StatusCreated {
				t.Fatalf("%s: %d %q, want 201", key, w.Code, w.Body)
			}
			if w := post(key); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" {
				t.Fatalf("%s retry: %d %q, want the replayed 201", key, w.Code, w.Body)
			}
		}
		var orders int
		if err := app.QueryRow("SELECT COUNT(*) FROM orders").Scan(&orders); err != nil {
			t.Fatal(err)
		}
		if orders != 2 || runs.Load() != 2 {
			t.Fatalf("%d orders, %d runs; want 2 and 2", orders, runs.Load())
		}
	})
}
