package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/idemkit/idem/internal/leakcheck"
	"github.com/idemkit/idem/internal/mysqltest"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/sqlstore"
	"github.com/idemkit/idem/storage/storagetest"
)

// TestMain stops the shared MariaDB and PostgreSQL servers and checks for
// leaked goroutines (the janitor's among them).
// The driver's log of broken connections (TestRecordOverMaxAllowedPacket
// breaks one on purpose) is dropped.
func TestMain(m *testing.M) {
	mysql.SetLogger(log.New(io.Discard, "", 0))
	leakcheck.Main(mysqltest.Wrap(pgtest.Wrap(m)))
}

// commit fences the owner's entry in a transaction that commits.
func commit(db *sql.DB, store *sqlstore.Store) func(ctx context.Context, key, owner string, ttl time.Duration) error {
	return func(ctx context.Context, key, owner string, ttl time.Duration) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if err := store.Fence(storage.ContextWithLease(ctx, storage.Lease{Key: key, Owner: owner, TTL: ttl}), tx); err != nil {
			return err
		}
		return tx.Commit()
	}
}

// storeMax is the WithMaxRecordBytes of the contract suite's store.
const storeMax = 1<<20 + 1024

// TestContract runs the contract suite on the server's real clock, with
// the inspection, committed-entry and too-large clauses.
func TestContract(t *testing.T) {
	forEach(t, func(t *testing.T, b *backend) {
		db := b.testDB(t)
		s := open(t, db, sqlstore.WithMaxRecordBytes(storeMax))
		storagetest.Run(t, func(t *testing.T) storagetest.Harness {
			return storagetest.Harness{Store: s, Commit: commit(db, s), MaxRecord: storeMax}
		})
	})
}

// TestKeysAreBinary: keys are VARBINARY (MySQL) or bytea (PostgreSQL),
// compared byte for byte: no collation folds "Key" into "key", "é" into
// "e", or drops a trailing space (which a PAD SPACE collation ignores);
// NUL bytes and bytes that are not UTF-8 are keys like any other.
func TestKeysAreBinary(t *testing.T) {
	forEach(t, func(t *testing.T, b *backend) {
		db := b.testDB(t)
		s := open(t, db)
		ctx := context.Background()
		keys := []string{"key", "Key", "KEY", "key ", "e", "é", "E", "\x00", "\x00\x00", "k\x00", "\xff", "\xff\xfe"}
		for i, k := range keys {
			res, err := s.Acquire(ctx, k, fmt.Sprint("o", i), fmt.Sprint("fp", i), time.Minute)
			if err != nil || res.State != storage.Acquired {
				t.Fatalf("Acquire(%q): %+v, %v; want a new entry of its own", k, res, err)
			}
		}
		for i, k := range keys {
			res, err := s.Acquire(ctx, k, "other", "x", time.Minute)
			if err != nil || res.State != storage.InFlight || res.Fingerprint != fmt.Sprint("fp", i) {
				t.Fatalf("Acquire(%q) again: %+v, %v; want its own entry in flight", k, res, err)
			}
		}
		if _, err := s.Acquire(ctx, strings.Repeat("k", sqlstore.MaxKeyLen+1), "o", "fp", time.Minute); !errors.Is(err, storage.ErrInvalid) {
			t.Fatalf("a key over MaxKeyLen: %v, want ErrInvalid", err)
		}
	})
}

// TestCleanupBatches: Cleanup deletes every expired row in batches of
// WithCleanupBatch, leaves live rows, and skips, without waiting, an
// expired row that a fenced transaction holds.
func TestCleanupBatches(t *testing.T) {
	forEach(t, func(t *testing.T, b *backend) {
		db := b.testDB(t)
		b.lockWait(t, db)
		s := open(t, db, sqlstore.WithCleanupBatch(7))
		ctx := context.Background()
		for i := range 30 {
			if _, err := s.Acquire(ctx, fmt.Sprint("old-", i), "o", "fp", time.Minute); err != nil {
				t.Fatal(err)
			}
		}
		shift(t, db, time.Hour)
		for i := range 5 {
			if _, err := s.Acquire(ctx, fmt.Sprint("live-", i), "o", "fp", time.Minute); err != nil {
				t.Fatal(err)
			}
		}
		// A fenced row whose TTL runs out while its transaction is open.
		if _, err := s.Acquire(ctx, "fenced", "o", "fp", time.Minute); err != nil {
			t.Fatal(err)
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if err := s.Fence(storage.ContextWithLease(ctx, storage.Lease{Key: "fenced", Owner: "o", TTL: time.Millisecond}), tx); err != nil {
			t.Fatal(err)
		}
		n := prompt(t, "Cleanup", func() int64 {
			n, err := s.Cleanup(ctx)
			if err != nil {
				t.Error(err)
			}
			return n
		})
		if n != 30 {
			t.Fatalf("Cleanup deleted %d rows, want the 30 expired", n)
		}
		var left int
		if err := db.QueryRow(query(t, db, "SELECT COUNT(*) FROM {table}")).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left != 6 {
			t.Fatalf("%d rows left, want the 5 live and the fenced one", left)
		}
		tx.Rollback()
	})
}

// TestManyAcquirersOneKey: 100 goroutines acquire one key at once, fresh,
// then again once it has expired: exactly one acquires each time, and
// nothing fails (no deadlock, no lock wait).
func TestManyAcquirersOneKey(t *testing.T) {
	forEach(t, func(t *testing.T, b *backend) {
		db := b.testDB(t)
		s := open(t, db)
		ctx := context.Background()
		for round := range 2 {
			const n = 100
			var wg sync.WaitGroup
			results := make([]storage.Result, n)
			start := make(chan struct{})
			for i := range n {
				wg.Go(func() {
					<-start
					res, err := s.Acquire(ctx, "k", fmt.Sprint(round, "-owner-", i), fmt.Sprint("fp-", i), time.Minute)
					if err != nil {
						t.Errorf("owner %d: %v", i, err)
					}
					results[i] = res
				})
			}
			close(start)
			wg.Wait()
			won := 0
			for _, r := range results {
				switch r.State {
				case storage.Acquired:
					won++
				case storage.InFlight:
				default:
					t.Errorf("round %d: %v", round, r.State)
				}
			}
			if won != 1 {
				t.Fatalf("round %d: %d owners acquired the key, want 1", round, won)
			}
			shift(t, db, time.Hour)
		}
	})
}

// TestChurn runs every operation on a few keys from many goroutines:
// InnoDB's row and gap locks under REPEATABLE READ must bring no
// deadlock (error 1213) or lock wait timeout (1205) to the caller, nor
// PostgreSQL's row locks a deadlock (40P01) or a failed NOWAIT (55P03);
// every error is one of the contract's.
func TestChurn(t *testing.T) {
	forEach(t, func(t *testing.T, b *backend) { churn(t, open(t, b.testDB(t))) })
}

// churn runs every operation of s on three keys from 12 goroutines and
// fails t on an error outside the contract's.
func churn(t *testing.T, s *sqlstore.Store) {
	ctx := context.Background()
	var wg sync.WaitGroup
	for g := range 12 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for i := range 150 {
				k := fmt.Sprint("k", r.IntN(3))
				o := fmt.Sprint("o", r.IntN(4))
				var err error
				switch r.IntN(7) {
				case 0, 1:
					_, err = s.Acquire(ctx, k, o, "fp", time.Duration(1+r.IntN(50))*time.Millisecond)
				case 2:
					err = s.Complete(ctx, k, o, []byte(fmt.Sprint(i)), time.Duration(1+r.IntN(50))*time.Millisecond)
				case 3:
					err = s.Release(ctx, k, o)
				case 4:
					err = s.Extend(ctx, k, o, time.Duration(1+r.IntN(50))*time.Millisecond)
				case 5:
					err = s.Issue(ctx, k, time.Duration(1+r.IntN(50))*time.Millisecond)
				case 6:
					_, err = s.AcquireIssued(ctx, k, o, "fp", time.Minute)
				}
				if err != nil && !errors.Is(err, storage.ErrNotOwner) && !errors.Is(err, storage.ErrExists) && !errors.Is(err, sqlstore.ErrLocked) {
					t.Errorf("%v", err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// TestRoundTrips counts the round trips of each path, on one connection
// whose statements are already prepared: a first execution (Acquire of a
// new key: a read and an INSERT; Complete: a locking read and an UPDATE),
// a replay and a conflict (one read each), and a Fence (its UPDATE, in
// the application's transaction, beside BEGIN and COMMIT).
func TestRoundTrips(t *testing.T) {
	forEach(t, func(t *testing.T, b *backend) {
		var c counter
		db := b.db(t, &c, nil)
		db.SetMaxOpenConns(1)
		s := open(t, db)
		ctx := context.Background()
		fence := func(key, owner string) {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Fence(storage.ContextWithLease(ctx, storage.Lease{Key: key, Owner: owner, TTL: time.Hour}), tx); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
		}
		run := func(key string) {
			if res, err := s.Acquire(ctx, key, "o1", "fp", time.Minute); err != nil || res.State != storage.Acquired {
				t.Fatal(res, err)
			}
			fence(key, "o1")
			if err := s.Complete(ctx, key, "o1", []byte("r"), time.Hour); err != nil {
				t.Fatal(err)
			}
			if res, err := s.Acquire(ctx, key, "o2", "fp", time.Minute); err != nil || res.State != storage.Done {
				t.Fatal(res, err)
			}
		}
		run("warm-up") // prepares every statement on the connection
		s.Acquire(ctx, "warm-up-2", "o1", "fp", time.Minute)
		s.Extend(ctx, "warm-up-2", "o1", time.Minute)
		s.Release(ctx, "warm-up-2", "o1")
		if res, err := s.Acquire(ctx, "busy", "o1", "fp", time.Minute); err != nil || res.State != storage.Acquired {
			t.Fatal(res, err)
		}
		for _, p := range []struct {
			name string
			want int64
			f    func()
		}{
			{"first Acquire", 2, func() { s.Acquire(ctx, "k", "o1", "fp", time.Minute) }},
			{"Fence, with BEGIN and COMMIT", 3, func() { fence("k", "o1") }},
			{"Complete", 2, func() { s.Complete(ctx, "k", "o1", []byte("r"), time.Hour) }},
			{"replay", 1, func() { s.Acquire(ctx, "k", "o2", "fp", time.Minute) }},
			{"conflict", 1, func() { s.Acquire(ctx, "busy", "o2", "fp", time.Minute) }},
			{"Extend", 2, func() { s.Extend(ctx, "busy", "o1", time.Minute) }},
			{"Release", 2, func() { s.Release(ctx, "busy", "o1") }},
		} {
			c.Reset()
			p.f()
			if got := c.RoundTrips(); got != p.want {
				t.Errorf("%s: %d round trips, want %d", p.name, got, p.want)
			}
		}
	})
}
