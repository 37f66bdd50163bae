package bench

import (
	"context"
	"math"
	"testing"

	"github.com/idemkit/idem/internal/tests/pgxtest"
	"github.com/jackc/pgx/v5"
)

// orders is the application's side of the fence cases: a table of orders
// on the SQL store's database, and the handler's own transaction that
// inserts one, as storage/pgstore's and storage/sqlstore's documentation
// show it.
type orders struct {
	st     store
	insert string
	// observe, when not nil, gets the statements and round trips of each
	// transaction that committed, from its begin to its commit.
	observe func(statements, roundTrips int64)
}

// newOrders creates the orders table, one of the test's own, on st's
// database (PostgreSQL or MySQL).
func newOrders(tb testing.TB, st store) *orders {
	tb.Helper()
	if st.db != nil && !st.sqlPG {
		// A statement without parameters: go-sql-driver/mysql sends it as
		// one query, where one with parameters would be prepared, run and
		// closed on each call (three round trips) without
		// interpolateParams. The store's own statements are prepared once
		// per connection.
		_, err := st.db.ExecContext(context.Background(), "CREATE TABLE orders"+
			" (id bigint AUTO_INCREMENT PRIMARY KEY, customer varchar(64) NOT NULL, total_cents bigint NOT NULL,"+
			" created timestamp(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) ENGINE=InnoDB")
		if err != nil {
			tb.Fatal(err)
		}
		return &orders{st: st, insert: "INSERT INTO orders (customer, total_cents) VALUES ('c_8d2f', 12990)"}
	}
	table := pgx.Identifier{pgxtest.Table(tb, st.pool)}.Sanitize()
	_, err := st.pool.Exec(context.Background(), "CREATE TABLE "+table+
		" (id bigserial PRIMARY KEY, customer text NOT NULL, total_cents bigint NOT NULL, created timestamptz NOT NULL DEFAULT now())")
	if err != nil {
		tb.Fatal(err)
	}
	if st.sqlPG {
		// Through database/sql, without parameters as on MySQL: pgx
		// sends it with the simple protocol, one round trip.
		return &orders{st: st, insert: "INSERT INTO " + table + " (customer, total_cents) VALUES ('c_8d2f', 12990)"}
	}
	return &orders{st: st, insert: "INSERT INTO " + table + " (customer, total_cents) VALUES ($1, $2)"}
}

// tx returns the handler's transaction: begin, insert an order, then
// Store.Fence if fence, and commit.
func (o *orders) tx(fence bool) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		var st0, rt0 int64
		if o.observe != nil {
			st0, _ = o.st.statements()
			rt0 = o.st.roundTrips()
		}
		var err error
		if o.st.db != nil {
			err = o.sqlTx(ctx, fence)
		} else {
			err = pgx.BeginFunc(ctx, o.st.pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, o.insert, "c_8d2f", 12990); err != nil {
					return err
				}
				if fence {
					return o.st.pg.Fence(ctx, tx)
				}
				return nil
			})
		}
		if err == nil && o.observe != nil {
			st1, _ := o.st.statements()
			o.observe(st1-st0, o.st.roundTrips()-rt0)
		}
		return err
	}
}

// sqlTx is tx through database/sql, for sqlstore.
func (o *orders) sqlTx(ctx context.Context, fence bool) error {
	tx, err := o.st.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, o.insert); err != nil {
		return err
	}
	if fence {
		if err := o.st.sql.Fence(ctx, tx); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// fenceStores are the stores with a Store.Fence, and the most allocations
// it may add to a handler's transaction on each.
var fenceStores = []struct {
	name   string
	allocs float64
}{{"postgres", pgFenceAllocs}, {"mysql", sqlFenceAllocs}, {"postgres-sql", sqlPGFenceAllocs}}

// newFenceSetups returns two setups of a on one store of kind sk
// (postgres, postgres-sql or mysql) and one orders table, whose handlers run the orders
// transaction before they answer: without the fence in plain, with it in
// fenced. Their bare stacks are the handler without the middleware.
func newFenceSetups(tb testing.TB, a adapter, sk storeKind) (plain, fenced *setup, o *orders) {
	tb.Helper()
	st := sk.open(tb, false)
	o = newOrders(tb, st)
	return newSetupOn(tb, a, st, handler{tx: o.tx(false)}), newSetupOn(tb, a, st, handler{tx: o.tx(true)}), o
}

// TestFence holds what Store.Fence adds to a handler's own transaction, on
// every store that has one (pgstore, and sqlstore on MariaDB and on
// PostgreSQL) and every adapter (each must hand the handler a context
// that carries the request's idem.Info, or Fence does nothing): exactly
// one statement and
// one round trip inside the transaction (begin, insert, fence, commit
// against begin, insert, commit), the middleware's round trips around it
// unchanged (2 on pgstore, 4 on sqlstore), and at most pgFenceAllocs,
// sqlFenceAllocs or sqlPGFenceAllocs allocations.
func TestFence(t *testing.T) {
	for _, fs := range fenceStores {
		t.Run(fs.name, func(t *testing.T) {
			for _, a := range adapters {
				t.Run(a.name, func(t *testing.T) { testFence(t, a, storeKindNamed(fs.name), fs.allocs) })
			}
		})
	}
}

func testFence(t *testing.T, a adapter, sk storeKind, budget float64) {
	plain, fenced, o := newFenceSetups(t, a, sk)
	var inTx struct{ statements, roundTrips, n int64 }
	o.observe = func(statements, roundTrips int64) {
		inTx.statements += statements
		inTx.roundTrips += roundTrips
		inTx.n++
	}
	st := plain.store
	for _, c := range []struct {
		name string
		s    *setup
		want int64 // statements and round trips in the transaction
	}{
		{"without the fence", plain, 3},
		{"with the fence", fenced, 4},
	} {
		send, ok := first(t, c.s)
		// Warms the connection: pgx prepares each statement on its first
		// use, sqlstore each of its statements once per connection (one
		// round trip more).
		if send(); !ok() {
			t.Fatalf("%s: unexpected answer", c.name)
		}
		const n = 20
		inTx.statements, inTx.roundTrips, inTx.n = 0, 0, 0
		st.resetCount()
		for range n {
			if send(); !ok() {
				t.Fatalf("%s: unexpected answer", c.name)
			}
		}
		if inTx.n != n || inTx.statements != c.want*n || inTx.roundTrips != c.want*n {
			t.Errorf("%s: %d statements and %d round trips in %d transactions, want %d of each per transaction",
				c.name, inTx.statements, inTx.roundTrips, inTx.n, c.want)
		}
		// Around the transaction: Acquire and Complete.
		want := (c.want + roundTripsOf(sk.name, "first")) * n
		if got, _ := st.statements(); got != want {
			t.Errorf("%s: %d statements for %d requests, want %d each", c.name, got, n, want/n)
		}
		if got := st.roundTrips(); got != want {
			t.Errorf("%s: %d round trips for %d requests, want %d each", c.name, got, n, want/n)
		}
	}
	o.observe = nil
	if raceEnabled {
		return // allocations are not measured under the race detector
	}
	// Both figures carry a few hundredths of an allocation per request
	// that come and go (the driver, the runtime), which the truncating
	// testing.AllocsPerRun would turn into one more or less in their
	// difference: the means are compared, rounded.
	// On a loaded machine the driver's and runtime's own goroutines
	// allocate now and then during a measure (the cold README run saw 19
	// for 18 on MySQL): noise only adds, so each side is the least of three.
	least := func(s *setup) float64 {
		m := math.Inf(1)
		for range 3 {
			m = min(m, mallocsPerRequest(t, s, "first", 100))
		}
		return m
	}
	over := math.Round(least(fenced) - least(plain))
	t.Logf("the fence: %v allocations (budget %v)", over, budget)
	check(t, "allocs/"+sk.name+"/fence", over, budget, "%s: the fence costs %v allocations, budget %v", a.name, over, budget)
}

// BenchmarkFence measures Store.Fence in a handler's own transaction on
// the PostgreSQL store, on every adapter:
//
//	BenchmarkFence/<adapter>/<case>
//
// bare is the handler alone: begin, insert an order, commit. first is the
// same handler behind the middleware, a new key for each request. fenced
// is first with Store.Fence before the commit; besides its cost over bare
// it reports its cost over first (ns-fence/op, allocs-fence/op,
// B-fence/op): what the fence costs. Keep all three in any -bench filter.
// With -count, each run is compared with the last run of the case before
// it, so ns-fence/op carries the noise of both: the difference of the
// medians of fenced and first says more.
// Skipped without PostgreSQL, like the postgres store of
// BenchmarkMiddleware. It measures pgstore only, under the same names as
// before sqlstore came; BenchmarkSQLFence measures sqlstore's.
func BenchmarkFence(b *testing.B) {
	for _, a := range adapters {
		b.Run(a.name, func(b *testing.B) { benchFence(b, a, storeKindNamed("postgres")) })
	}
}

// BenchmarkSQLFence is BenchmarkFence on sqlstore, through database/sql:
// its PostgreSQL dialect through pgx's driver, and MariaDB.
//
//	BenchmarkSQLFence/<adapter>/<store>/<case>
//
// Skipped without the store's server, as in BenchmarkMiddleware. TestFence
// holds the same transactions' round trips, statements and allocations.
func BenchmarkSQLFence(b *testing.B) {
	for _, a := range adapters {
		b.Run(a.name, func(b *testing.B) {
			for _, name := range []string{"postgres-sql", "mysql"} {
				b.Run(name, func(b *testing.B) { benchFence(b, a, storeKindNamed(name)) })
			}
		})
	}
}

// benchFence runs the cases of BenchmarkFence on a and sk.
func benchFence(b *testing.B, a adapter, sk storeKind) {
	plain, fenced, _ := newFenceSetups(b, a, sk)
	var bare, unfenced *cost
	for _, fc := range []struct {
		name string
		bc   benchCase
		s    *setup
	}{
		{"bare", caseNamed("bare"), plain},
		{"first", caseNamed("first"), plain},
		{"fenced", caseNamed("first"), fenced},
	} {
		b.Run(fc.name, func(b *testing.B) {
			c := measure(b, fc.bc, fc.s)
			switch fc.name {
			case "bare":
				bare = &c
				return
			case "first":
				unfenced = &c
			case "fenced":
				if unfenced != nil {
					b.ReportMetric(c.ns-unfenced.ns, "ns-fence/op")
					b.ReportMetric(c.allocs-unfenced.allocs, "allocs-fence/op")
					b.ReportMetric(c.bytes-unfenced.bytes, "B-fence/op")
				}
			}
			if bare != nil {
				b.ReportMetric(c.ns-bare.ns, "ns-over-bare/op")
				b.ReportMetric(c.allocs-bare.allocs, "allocs-over-bare/op")
				b.ReportMetric(c.bytes-bare.bytes, "B-over-bare/op")
			}
		})
	}
}
