package bench

import (
	"context"
	"net/http"
	"os"
	"runtime"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/labstack/echo/v4"
)

// The budgets of issue 4 that a test can hold deterministically: store
// round trips and allocations per request. Times are measured by
// BenchmarkMiddleware and the load tool, never asserted.
const (
	// Memory store, allocations over the bare handler, per adapter.
	// First executions: 8 in issue 4, renegotiated to 9 in issue 19,
	// whose simpler forms cost two (measured 6 to 7 before, 8 to 9
	// after): the storage.Lease that a protected execution's context
	// carries for a store's fence (so that pgstore needs neither the root
	// package nor response), and the memory store's own copy of the
	// record, since storage.RecordKeeper, which let it keep the
	// middleware's buffer, went (it can pay on no shared store). Back to
	// 7 in issue 22 (measured 6, 6, 7): the execution's own context
	// answers storage.LeaseKey, without a context.WithValue and a boxed
	// Lease per request.
	memFirstAllocs  = 7
	memReplayAllocs = 5
	memPassAllocs   = 0
	// Redis store, allocations over the bare handler. First executions: 30
	// until issue 28 made an Acquire a SET NX GET (measured 24 to 25
	// before, 43 to 44 after): its answer to a new key is nil, which
	// go-redis hands back as the error redis.Nil, and on any error its
	// Process runs its retry and bad-connection checks (shouldRetry and
	// its Is*Error calls), about 19 allocations, in the client; Redis's
	// own time per first execution fell by about two thirds. Replays
	// fell (10 to 14 before, 9 to 13 after).
	redisFirstAllocs  = 45
	redisReplayAllocs = 15
	// PostgreSQL store, allocations over the bare handler. Issue 4 set no
	// budget for this store, which came later: these are the levels
	// measured when it joined the benchmarks (the most of the three
	// adapters), held as ceilings so that a regression fails.
	// First executions: 47 until issue 19 added the storage.Lease
	// context (measured 45 to 47 before, 48 to 49 after).
	pgFirstAllocs    = 49
	pgReplayAllocs   = 23
	pgConflictAllocs = 29
	pgPassAllocs     = 0
	// The allocations that Store.Fence adds to a handler's own
	// transaction: also a level measured, held as a ceiling. 9 since
	// issue 22: the fence's storage.LeaseFromContext boxes the Lease
	// that the execution's context now builds when asked, instead of
	// every protected request allocating it (and a context.WithValue)
	// whether it fences or not, so a fenced request allocates one less
	// in all (first 8 -> 6, the fence 8 -> 9).
	pgFenceAllocs = 9
	// sqlstore on MariaDB through database/sql and go-sql-driver/mysql
	// v1.10.1 (issue 29), allocations over the bare handler: no budget
	// either, the levels measured when it joined the benchmarks (the most
	// of the three adapters, with the margin pgstore's have: none), held
	// as ceilings. Measured in 9 runs of the package, every one alike:
	// first 88, 88, 89 (nethttp, gin, echo); replay 29, 26, 30; conflict
	// 34, 31, 35; passthrough 0, 0, 1 (Echo's, as any middleware's). A
	// first execution is four statements (pgstore's two), each through
	// database/sql's prepared-statement path (its connection request, its
	// driver.NamedValue arguments, the driver's packets), hence about
	// twice pgstore's allocations.
	sqlFirstAllocs    = 89
	sqlReplayAllocs   = 30
	sqlConflictAllocs = 35
	sqlPassAllocs     = 0
	// The allocations that sqlstore's Store.Fence adds to a handler's own
	// transaction through database/sql: measured 18 on every adapter in
	// each of 4 runs (tx.StmtContext rebinds the store's prepared
	// statement to the transaction's connection on each call, then runs
	// it), held as a ceiling.
	sqlFenceAllocs = 18
	// sqlstore's PostgreSQL dialect through database/sql and pgx's
	// driver, github.com/jackc/pgx/v5/stdlib v5.12 (issue 29), allocations
	// over the bare handler: no budget either, the levels measured when
	// it joined the benchmarks, with two of headroom, held as ceilings.
	// Measured in 6 runs of the package: first 131 to 133; replay 46,
	// 43, 47 and conflict 50, 47, 51 (nethttp, gin, echo) in every run;
	// passthrough 0, 0, 1 (Echo's). The same four statements as on
	// MariaDB, each through database/sql's prepared-statement path and
	// pgx's driver (not profiled further): about half as many again as
	// go-sql-driver/mysql's, nearly three times pgstore's.
	sqlPGFirstAllocs    = 135
	sqlPGReplayAllocs   = 49
	sqlPGConflictAllocs = 53
	sqlPGPassAllocs     = 0
	// The allocations that its Store.Fence adds to a handler's own
	// transaction: measured 17 on every adapter in each of 6 runs, held
	// with one of headroom.
	sqlPGFenceAllocs = 18
	// dynamostore on dynalite through aws-sdk-go-v2's DynamoDB client
	// (service/dynamodb v1.74, smithy-go v1.28), allocations over the bare
	// handler: no budget either, the levels measured when it joined the
	// benchmarks, with about 2-3% of headroom, held as ceilings. Measured
	// in 6 runs of TestAllocationBudget (nethttp, gin, echo): first 763
	// to 764, 763 to 764, 764 to 765; replay 832 to 833, 829 to 830, 834
	// to 835; conflict 829 to 830, 826 to 828, 830 to 832; passthrough 0,
	// 0, 1 (Echo's). A first execution is two requests, as on pgstore,
	// but each costs the SDK about 340 allocations (profiled with
	// -memprofile): it builds the operation's middleware stack anew on
	// every call (smithy-go's steps, the operation's middlewares, a
	// context.WithValue for each of their values: about 100), signs the
	// request with SigV4 (canonical headers, hex, SHA-256 of the payload
	// and the HMAC chain: about 50), writes the request and reads the
	// answer through net/http (the request's clone, its headers, the
	// answer's header in the transport's read loop: about 45), encodes
	// the request and decodes the answer as JSON (every attribute an
	// AttributeValue: about 35), and runs its retry, metrics and tracing
	// middlewares around the attempt. A replay or a conflict is two
	// requests too on dynalite (the conditional PutItem, then a GetItem),
	// and costs more: the SDK makes an error of the failed condition (the
	// exception decoded, wrapped in a ResponseError and an
	// OperationError), and the GetItem's answer is the whole item. A
	// 1 MiB answer (compressible: it is stored compressed) allocates
	// 2.11x to 2.17x its size, within largeBytesFactor: 2.62x to 2.68x
	// until the store compressed into a pooled buffer, sent as it is
	// (it grew a new buffer of half the record, and cloned what it sent).
	dynamoFirstAllocs    = 785
	dynamoReplayAllocs   = 855
	dynamoConflictAllocs = 850
	dynamoPassAllocs     = 0
	// Bytes allocated by a request answering 1 MiB, over the bare
	// handler, as a multiple of the body: one capture copy plus the
	// encoded record. The memory store keeps a copy of its own as well
	// (a store copies what it keeps; 2.2 until issue 19 removed
	// storage.RecordKeeper, measured 2.01 before and 3.02 after).
	largeBytesFactor    = 2.2
	memLargeBytesFactor = 3.1
	// Redis bytes per stored record, beyond the body and the stored
	// header names and values.
	redisRecordOverhead = 96
)

// knownMiss is a budget this code base misses today: the level measured
// today, which the figure must not exceed, and why the budget is missed.
type knownMiss struct {
	ceiling float64
	why     string
}

// knownMisses are the budgets missed today, measured and explained in
// docs/performance.md. A known miss is logged, loudly, as KNOWN MISS
// instead of failing, as long as the figure stays within the entry's
// ceiling; worse than that, it fails as a regression. IDEM_BUDGET_STRICT=1
// makes every miss fail. A miss not listed here always fails, and so does
// an entry whose budget is met: remove it then. The budgets themselves are
// not changed.
var knownMisses = map[string]knownMiss{
	"large/postgres":     {4.04, "pgx copies the record twice on its way to the socket: it encodes the []byte parameter into the query's buffer of parameter values, then copies that into the Bind message in the connection's write buffer, and drops either buffer after a query that grew it past 256 bytes and 1 KiB, so both are allocated anew for each Complete; with the capture and the record itself that is four times the body"},
	"large/mysql":        {4.04, "go-sql-driver/mysql copies the record twice on its way to the socket, as pgx does: writeExecutePacket appends the []byte parameter to a new slice of parameter values, then appends that to the COM_STMT_EXECUTE packet's buffer, grown anew past the connection's buffer, for each Complete; with the capture and the record itself that is four times the body (measured with -memprofile)"},
	"large/postgres-sql": {4.04, "the same two copies as large/postgres: pgx's database/sql driver hands the record to pgx's extended protocol, which encodes the []byte parameter into the query's buffer of parameter values (encodePlanBytesCodecBinaryBytes), then copies that into the Bind message, both allocated anew for each Complete (measured 4.03x, with -memprofile)"},
	"record/redis":       {472, "with the 37-byte key of the test, Redis 7.0 spends 88 bytes on the key, its dict entry and object header, leaving 302 for the value; the 366-byte value (333 before the completing owner was kept, 329 before the record checksum) takes a 384-byte allocation, and no value holding the 294 bytes of body and headers uncompressed (and the 16-byte fingerprint) fits the 256-byte class below 302"},
}

// check holds the figure got of the budget named key, which it must not
// exceed: a failure, a logged known miss within its ceiling, or a failure
// when a known miss has met its budget (its entry must go).
func check(t *testing.T, key string, got, budget float64, format string, args ...any) {
	t.Helper()
	km, known := knownMisses[key]
	switch {
	case got <= budget && known:
		t.Errorf("%s: budget met (%v, budget %v): remove its knownMisses entry", key, got, budget)
	case got <= budget:
	case known && got <= km.ceiling && os.Getenv("IDEM_BUDGET_STRICT") != "1":
		t.Logf("KNOWN MISS ("+km.why+"): "+format, args...)
	case known && got > km.ceiling:
		t.Errorf("REGRESSION of a known miss (ceiling %v): "+format, append([]any{km.ceiling}, args...)...)
	default:
		t.Errorf(format, args...)
	}
}

// roundTrips is the number of store round trips each case costs, on Redis
// and on PostgreSQL and MySQL, where each is one statement.
var roundTrips = map[string]int64{"passthrough": 0, "first": 2, "replay": 1, "conflict": 1}

// redisRoundTrips are the Redis store's, where they differ: a conflict is
// a SET NX GET that finds another owner's entry, then its PTTL (issue
// 28: the SET made replays and first executions cheaper for Redis).
var redisRoundTrips = map[string]int64{"conflict": 2}

// sqlRoundTrips are sqlstore's, on MariaDB and on PostgreSQL alike, where
// they differ: MySQL has no RETURNING and no data-modifying CTE, so a
// first execution is an Acquire of two statements (a plain read, an
// INSERT) and a Complete of two (a locking read with NOWAIT, an UPDATE),
// and the PostgreSQL dialect runs the same four; see storage/sqlstore's
// TestRoundTrips.
var sqlRoundTrips = map[string]int64{"first": 4}

// dynamoRoundTrips are dynamostore's on dynalite, where they differ, in
// HTTP requests: a first execution is a conditional PutItem and an
// UpdateItem, as anywhere; a replay or a conflict is a conditional
// PutItem whose condition fails, then a strongly consistent GetItem of
// the item in the way, since dynalite sends no item back with
// ReturnValuesOnConditionCheckFailure. On DynamoDB itself, which does,
// each is the PutItem alone, 1 (see storage/dynamostore's TestRoundTrips).
var dynamoRoundTrips = map[string]int64{"replay": 2, "conflict": 2}

// roundTripsOf returns the round trips of the case on the store kind.
func roundTripsOf(store, name string) int64 {
	if r, ok := map[string]map[string]int64{"redis": redisRoundTrips, "mysql": sqlRoundTrips, "postgres-sql": sqlRoundTrips,
		"dynamodb": dynamoRoundTrips}[store][name]; ok {
		return r
	}
	return roundTrips[name]
}

// allocsPerRequest returns the allocations of one request of the case on
// s, averaged by testing.AllocsPerRun.
func allocsPerRequest(t *testing.T, s *setup, name string, runs int) float64 {
	t.Helper()
	send, ok := caseNamed(name).prepare(t, s)
	if send(); !ok() {
		t.Fatalf("%s: unexpected answer", name)
	}
	n := testing.AllocsPerRun(runs, send)
	if !ok() {
		t.Fatalf("%s: unexpected answer", name)
	}
	return n
}

// perRequest returns the mean allocations and bytes of one request of the
// case on s over runs, unrounded, measured as testing.AllocsPerRun does
// (on one P, after a request that warms up).
func perRequest(t *testing.T, s *setup, name string, runs int) (mallocs, bytes float64) {
	t.Helper()
	send, ok := caseNamed(name).prepare(t, s)
	if send(); !ok() {
		t.Fatalf("%s: unexpected answer", name)
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range runs {
		send()
	}
	runtime.ReadMemStats(&after)
	if !ok() {
		t.Fatalf("%s: unexpected answer", name)
	}
	return float64(after.Mallocs-before.Mallocs) / float64(runs), float64(after.TotalAlloc-before.TotalAlloc) / float64(runs)
}

// bytesPerRequest returns the bytes one request of the case on s
// allocates, averaged over runs.
func bytesPerRequest(t *testing.T, s *setup, name string, runs int) float64 {
	t.Helper()
	_, b := perRequest(t, s, name, runs)
	return b
}

// mallocsPerRequest returns the allocations of one request of the case on
// s, averaged over runs.
func mallocsPerRequest(t *testing.T, s *setup, name string, runs int) float64 {
	t.Helper()
	m, _ := perRequest(t, s, name, runs)
	return m
}

func TestAllocationBudget(t *testing.T) {
	if raceEnabled {
		t.Skip("allocations are not measured under the race detector")
	}
	budgets := map[string]map[string]float64{
		"memory": {"passthrough": memPassAllocs, "first": memFirstAllocs, "replay": memReplayAllocs},
		"redis":  {"first": redisFirstAllocs, "replay": redisReplayAllocs},
		"postgres": {"passthrough": pgPassAllocs, "first": pgFirstAllocs, "replay": pgReplayAllocs,
			"conflict": pgConflictAllocs},
		"mysql": {"passthrough": sqlPassAllocs, "first": sqlFirstAllocs, "replay": sqlReplayAllocs,
			"conflict": sqlConflictAllocs},
		"postgres-sql": {"passthrough": sqlPGPassAllocs, "first": sqlPGFirstAllocs, "replay": sqlPGReplayAllocs,
			"conflict": sqlPGConflictAllocs},
		"dynamodb": {"passthrough": dynamoPassAllocs, "first": dynamoFirstAllocs, "replay": dynamoReplayAllocs,
			"conflict": dynamoConflictAllocs},
	}
	for _, sk := range storeKinds {
		t.Run(sk.name, func(t *testing.T) {
			for _, a := range adapters {
				t.Run(a.name, func(t *testing.T) {
					s := newSetup(t, a, sk, false)
					bare := allocsPerRequest(t, s, "bare", 200)
					for _, name := range []string{"passthrough", "first", "replay", "conflict"} {
						over := allocsPerRequest(t, s, name, 200) - bare
						budget, ok := budgets[sk.name][name]
						if name == "passthrough" && ok {
							// "Near zero": no more than the framework
							// charges any middleware (Echo allocates the
							// route's middleware chain per request).
							budget += noopAllocs(t, a)
						}
						t.Logf("%s: %v allocations over bare (budget %v)", name, over, budgetText(budget, ok))
						if ok {
							check(t, "allocs/"+sk.name+"/"+name, over, budget, "%s/%s/%s: %v allocations over bare, budget %v", a.name, sk.name, name, over, budget)
						}
					}
				})
			}
		})
	}
}

func budgetText(b float64, ok bool) any {
	if !ok {
		return "none"
	}
	return b
}

func TestRedisRoundTrips(t *testing.T) { testRoundTrips(t, storeKindNamed("redis")) }

// TestPostgresRoundTrips counts with pgxtest.Counter: the writes to the
// connections' sockets, and the statements, which must be as many.
func TestPostgresRoundTrips(t *testing.T) { testRoundTrips(t, storeKindNamed("postgres")) }

// TestMySQLRoundTrips counts with sqlCounter, the same way: the writes to
// the connections' sockets, and the statements (executions of prepared
// statements once the connection is warm), which must be as many.
func TestMySQLRoundTrips(t *testing.T) { testRoundTrips(t, storeKindNamed("mysql")) }

// TestPostgresSQLRoundTrips counts sqlstore's PostgreSQL dialect through
// pgx's database/sql driver with pgxtest.Counter, as
// TestPostgresRoundTrips does.
func TestPostgresSQLRoundTrips(t *testing.T) { testRoundTrips(t, storeKindNamed("postgres-sql")) }

// testRoundTrips holds every adapter on the store to roundTrips.
func testRoundTrips(t *testing.T, sk storeKind) {
	for _, a := range adapters {
		t.Run(a.name, func(t *testing.T) {
			s := newSetup(t, a, sk, false)
			for _, name := range []string{"passthrough", "first", "replay", "conflict"} {
				send, ok := caseNamed(name).prepare(t, s)
				// Warms the connection: Redis's HELLO and scripts,
				// PostgreSQL's statements, which pgx prepares on a
				// connection's first use of each (one round trip more).
				send()
				const n = 50
				s.store.resetCount()
				for range n {
					send()
				}
				got := s.store.roundTrips()
				if !ok() {
					t.Fatalf("%s: unexpected answer", name)
				}
				each := roundTripsOf(sk.name, name)
				if want := each * n; got != want {
					t.Errorf("%s: %d round trips for %d requests, want %d each", name, got, n, each)
				}
				if st, ok := s.store.statements(); ok && st != got {
					t.Errorf("%s: %d statements for %d round trips, want as many", name, st, got)
				}
			}
		})
	}
}

func TestLargeResponseBytes(t *testing.T) {
	if raceEnabled {
		t.Skip("allocations are not measured under the race detector")
	}
	for _, sk := range storeKinds {
		t.Run(sk.name, func(t *testing.T) {
			a := adapters[0]
			bare := bytesPerRequest(t, newSetup(t, a, sk, true), "bare", 20)
			s := newSetup(t, a, sk, true)
			if sk.name == "redis" {
				t.Cleanup(func() { s.store.trim(t) })
			}
			got := bytesPerRequest(t, s, "large", 20) - bare
			if s.store.dynamo != nil {
				// The records were kept, compressed: a record refused
				// (ErrTooLarge) would leave the answers as they are.
				for _, it := range s.store.dynamoItems(t) {
					if _, ok := it["record_z"]; !ok {
						t.Fatalf("dynamodb: an item without a compressed record: %d attributes, state %v", len(it), it["state"])
					}
				}
			}
			factor, budget := got/float64(len(largeBody)), largeBytesFactor
			if sk.name == "memory" {
				budget = memLargeBytesFactor
			}
			t.Logf("large: %.0f bytes over bare per request, %.2fx the body (budget %.1fx)", got, factor, budget)
			check(t, "large/"+sk.name, factor, budget, "a 1 MiB response allocates %.2fx its size, budget %.1fx", factor, budget)
		})
	}
}

func TestRecordSize(t *testing.T) {
	for _, sk := range storeKinds {
		t.Run(sk.name, func(t *testing.T) {
			s := newSetup(t, adapters[0], sk, false)
			send, ok := caseNamed("replay").prepare(t, s) // stores one record
			send()
			if !ok() {
				t.Fatal("no replay")
			}
			payload := len(orderJSON) + storedHeaderBytes
			switch {
			case s.store.mem != nil:
				got := s.store.mem.Bytes()
				t.Logf("memory store: %d bytes accounted for %d of body and stored headers (+%d: key, fingerprint, encoding)", got, payload, got-payload)
			case s.store.pg != nil || s.store.sqlPG:
				// The row's size as PostgreSQL stores it (its tuple header
				// included, not its 4-byte line pointer) and its record's;
				// the indexes (key, expires, state and since) hold an
				// entry each besides.
				var row, rec int
				err := s.store.pool.QueryRow(context.Background(),
					"SELECT pg_column_size(t.*), pg_column_size(t.record) FROM "+s.store.table+" t").Scan(&row, &rec)
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("%s: row %d bytes (record %d) for %d of body and stored headers (+%d: key, owner, fingerprint, state, expiry, since, encoding, tuple header)",
					sk.name, row, rec, payload, row-payload)
			case s.store.sql != nil:
				// The row's columns as stored, three BIGINTs not NULL
				// (InnoDB adds a row header, the record's length and the
				// two secondary indexes' entries).
				var row, rec int
				err := s.store.db.QueryRow("SELECT LENGTH(`key`) + LENGTH(state) + LENGTH(owner) + LENGTH(fingerprint) + 8*3 + LENGTH(record), LENGTH(record) FROM "+
					s.store.sqlTable).Scan(&row, &rec)
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("mysql: columns %d bytes (record %d) for %d of body and stored headers (+%d: key, owner, fingerprint, state, expires, since, rev, encoding; InnoDB's row header besides)",
					row, rec, payload, row-payload)
			case s.store.dynamo != nil:
				// The item's size as DynamoDB counts it against its
				// 400 KB (names and values of its attributes).
				items := s.store.dynamoItems(t)
				if len(items) != 1 {
					t.Fatalf("%d items, want 1", len(items))
				}
				rec, ok := items[0]["record"].(*types.AttributeValueMemberB)
				if !ok {
					t.Fatalf("no uncompressed record: %v", items[0])
				}
				size := itemSize(items[0])
				t.Logf("dynamodb: item %d bytes (record %d) for %d of body and stored headers (+%d: key, owner, fingerprint, state, expiry, TTL, since, size, encoding, the attributes' names)",
					size, len(rec.Value), payload, size-payload)
			default:
				ctx := context.Background()
				keys, err := s.store.rdb.Keys(ctx, s.store.prefix+"*").Result()
				if err != nil || len(keys) != 1 {
					t.Fatalf("keys %v, %v", keys, err)
				}
				usage, err := s.store.rdb.MemoryUsage(ctx, keys[0]).Result()
				if err != nil {
					t.Fatal(err)
				}
				val, _ := s.store.rdb.StrLen(ctx, keys[0]).Result()
				t.Logf("redis: MEMORY USAGE %d bytes (value %d, key %d) for %d of body and stored headers (+%d; budget +%d)",
					usage, val, len(keys[0]), payload, usage-int64(payload), redisRecordOverhead)
				check(t, "record/redis", float64(usage), float64(payload+redisRecordOverhead), "a stored record takes %d bytes in Redis, budget %d (body %d + headers %d + %d)",
					usage, payload+redisRecordOverhead, len(orderJSON), storedHeaderBytes, redisRecordOverhead)
			}
		})
	}
}

// noopAllocs returns the allocations per request that a middleware which
// only calls the next handler costs on the adapter's framework: none for
// net/http and Gin, one for Echo, which builds the closure each route
// middleware returns anew for every request.
func noopAllocs(t *testing.T, a adapter) float64 {
	t.Helper()
	var with, without http.Handler
	switch a.name {
	case "echo":
		mount := func(mw ...echo.MiddlewareFunc) http.Handler {
			e := echo.New()
			e.POST("/orders", echoHandler(handler{}), mw...)
			return e
		}
		noop := func(next echo.HandlerFunc) echo.HandlerFunc {
			return func(c echo.Context) error { return next(c) }
		}
		with, without = mount(noop), mount()
	default:
		return 0
	}
	per := func(h http.Handler) float64 {
		c := newClient(h, http.MethodPost)
		return testing.AllocsPerRun(200, c.send)
	}
	return per(with) - per(without)
}
