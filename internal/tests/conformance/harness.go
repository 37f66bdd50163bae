// Package conformance is the behaviour suite that every adapter (net/http,
// Gin, Echo) passes on every store, so that the three behave identically.
// An adapter's test calls [Run] with an [Adapter] that mounts plain
// http.Handlers on its framework.
package conformance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/redistest"
	"github.com/idemkit/idem/internal/testclock"
	"github.com/idemkit/idem/internal/tests/pgxtest"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/memstore"
	"github.com/idemkit/idem/storage/pgstore"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/idemkit/idem/storage/rueidisstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// Adapter mounts routes on one framework.
type Adapter struct {
	Name string
	// Mount returns the framework's server for routes, each protected by m
	// through the adapter, behind the framework's own panic recovery (for
	// net/http, a plain recover that answers 500).
	Mount func(m *idem.Middleware, routes ...Route) http.Handler
}

// Route is one endpoint. Pattern uses net/http syntax ("/orders/{id}");
// adapters translate {id} to their own.
type Route struct {
	Method  string
	Pattern string
	Handler http.Handler
}

// storeKind makes a fresh store for one test.
type storeKind struct {
	name string
	// open returns the store and a function that moves its clock forward
	// (on a real Redis: the TTLs of the store's own keys).
	open func(t *testing.T) (storage.Store, func(time.Duration))
}

var storeKinds = []storeKind{
	{"memory", func(t *testing.T) (storage.Store, func(time.Duration)) {
		clk := testclock.New(time.Now())
		s := memstore.New(memstore.WithClock(clk.Now))
		t.Cleanup(func() { s.Close() })
		return s, clk.Advance
	}},
	{"miniredis", func(t *testing.T) (storage.Store, func(time.Duration)) {
		mr := miniredis.RunT(t)
		rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
		t.Cleanup(func() { rdb.Close() })
		return redisstore.New(rdb), mr.FastForward
	}},
	{"redis", func(t *testing.T) (storage.Store, func(time.Duration)) {
		rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr(t)})
		t.Cleanup(func() { rdb.Close() })
		prefix := "conf:" + randomHex(8) + ":"
		return redisstore.New(rdb, redisstore.WithPrefix(prefix)), redisAdvance(t, rdb, prefix)
	}},
	// Every scenario runs on the cluster too: once the cluster is up (about
	// 3 s, once per test binary) a scenario costs what it costs on "redis".
	{"cluster", func(t *testing.T) (storage.Store, func(time.Duration)) {
		rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.ClusterAddrs(t)})
		t.Cleanup(func() { rdb.Close() })
		prefix := "conf:" + randomHex(8) + ":"
		return redisstore.New(rdb, redisstore.WithPrefix(prefix)), redisAdvance(t, rdb, prefix)
	}},
	// The same two on rueidisstore, the Redis store on the rueidis client:
	// its clock moves as redisstore's, through a go-redis client of its
	// own.
	{"rueidis", func(t *testing.T) (storage.Store, func(time.Duration)) {
		addr := redistest.Addr(t)
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { rdb.Close() })
		prefix := "conf:" + randomHex(8) + ":"
		return rueidisstore.New(rueidisClient(t, addr), rueidisstore.WithPrefix(prefix)), redisAdvance(t, rdb, prefix)
	}},
	{"rueidis-cluster", func(t *testing.T) (storage.Store, func(time.Duration)) {
		addrs := redistest.ClusterAddrs(t)
		rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
		t.Cleanup(func() { rdb.Close() })
		prefix := "conf:" + randomHex(8) + ":"
		return rueidisstore.New(rueidisClient(t, addrs...), rueidisstore.WithPrefix(prefix)), redisAdvance(t, rdb, prefix)
	}},
	// PostgreSQL: a table of the test's own on the binary's shared server
	// (skipped when PostgreSQL is not installed, unless IDEM_REQUIRE_PG=1).
	{"postgres", func(t *testing.T) (storage.Store, func(time.Duration)) {
		pool := pgxtest.Pool(t)
		table := pgxtest.Table(t, pool)
		s, err := pgstore.New(pool, pgstore.WithTable(table))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		if err := s.CreateTable(t.Context()); err != nil {
			t.Fatal(err)
		}
		return s, pgAdvance(t, pool, table)
	}},
}

// rueidisClient returns a rueidis client for addrs (one server, or nodes
// of a cluster) with rueidisstore.ClientOption's options, but a
// connection given up after seconds of silence, not 250 ms: the
// scenarios run in parallel, under -race on a small machine.
func rueidisClient(t *testing.T, addrs ...string) rueidis.Client {
	opt := rueidisstore.ClientOption(addrs...)
	opt.Dialer.KeepAlive, opt.ConnWriteTimeout = time.Second, 10*time.Second
	opt.Dialer.Timeout = 10 * time.Second // rueidis bounds a new connection's handshake (HELLO) by it too
	c, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatalf("rueidis.NewClient: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// pgAdvance returns a function that moves time forward by d for the rows
// of a pgstore table, whose database's clock cannot be moved: each row's
// expiry comes d sooner. It is called on the test's goroutine, while the
// scenario holds still.
func pgAdvance(t *testing.T, pool *pgxpool.Pool, table string) func(time.Duration) {
	q := "UPDATE " + pgx.Identifier{table}.Sanitize() + " SET expires = expires - $1::bigint * interval '1 microsecond'"
	return func(d time.Duration) {
		t.Helper()
		if _, err := pool.Exec(t.Context(), q, d.Microseconds()); err != nil {
			t.Fatalf("advancing the rows of %s by %v: %v", table, d, err)
		}
	}
}

// redisAdvance returns a function that moves time forward by d for the
// keys under prefix on a real Redis, whose clock cannot be moved: each
// key's PTTL is cut by d (the key is deleted when nothing is left). On a
// cluster it scans every master. It is called on the test's goroutine,
// while the scenario holds still.
func redisAdvance(t *testing.T, rdb redis.UniversalClient, prefix string) func(time.Duration) {
	return func(d time.Duration) {
		t.Helper()
		ctx := t.Context()
		shift := func(ctx context.Context, node redis.UniversalClient) error {
			iter := node.Scan(ctx, 0, prefix+"*", 100).Iterator()
			for iter.Next(ctx) {
				if err := shiftScript.Run(ctx, node, []string{iter.Val()}, d.Milliseconds()).Err(); err != nil {
					return err
				}
			}
			return iter.Err()
		}
		var err error
		if c, ok := rdb.(*redis.ClusterClient); ok {
			err = c.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error { return shift(ctx, node) })
		} else {
			err = shift(ctx, rdb)
		}
		if err != nil {
			t.Fatalf("advancing Redis keys %s* by %v: %v", prefix, d, err)
		}
	}
}

// shiftScript cuts KEYS[1]'s TTL by ARGV[1] ms, deleting it when nothing is
// left; a key without TTL is left alone.
var shiftScript = redis.NewScript(`
local left = redis.call('PTTL', KEYS[1])
if left < 0 then return 0 end
left = left - tonumber(ARGV[1])
if left <= 0 then
  redis.call('DEL', KEYS[1])
else
  redis.call('PEXPIRE', KEYS[1], left)
end
return 1
`)

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// errDown is what a store that is "down" answers.
var errDown = errors.New("conformance: store down")

// spy wraps a store: it counts calls and can fail them all.
type spy struct {
	storage.Store
	down     atomic.Bool
	acquires atomic.Int64
	acquired chan struct{} // gets a value after each Acquire, if not full
}

func (s *spy) Acquire(ctx context.Context, key, owner, fp string, lease time.Duration) (storage.Result, error) {
	return s.acquire(func() (storage.Result, error) { return s.Store.Acquire(ctx, key, owner, fp, lease) })
}

// acquire counts one Acquire (or AcquireIssued) and runs it, unless the
// store is down.
func (s *spy) acquire(call func() (storage.Result, error)) (storage.Result, error) {
	s.acquires.Add(1)
	defer func() {
		select {
		case s.acquired <- struct{}{}:
		default:
		}
	}()
	if s.down.Load() {
		return storage.Result{}, errDown
	}
	return call()
}

// Issue and AcquireIssued make the spy a storage.Issuer when its store is
// one (every store kind here is), for WithIssuedKeys.
func (s *spy) Issue(ctx context.Context, key string, ttl time.Duration) error {
	if s.down.Load() {
		return errDown
	}
	return s.Store.(storage.Issuer).Issue(ctx, key, ttl)
}

func (s *spy) AcquireIssued(ctx context.Context, key, owner, fp string, lease time.Duration) (storage.Result, error) {
	return s.acquire(func() (storage.Result, error) {
		return s.Store.(storage.Issuer).AcquireIssued(ctx, key, owner, fp, lease)
	})
}

func (s *spy) Complete(ctx context.Context, key, owner string, rec []byte, ttl time.Duration) error {
	if s.down.Load() {
		return errDown
	}
	return s.Store.Complete(ctx, key, owner, rec, ttl)
}

func (s *spy) Release(ctx context.Context, key, owner string) error {
	if s.down.Load() {
		return errDown
	}
	return s.Store.Release(ctx, key, owner)
}

func (s *spy) Extend(ctx context.Context, key, owner string, lease time.Duration) error {
	if s.down.Load() {
		return errDown
	}
	return s.Store.Extend(ctx, key, owner, lease)
}

// events records observer events.
type events struct {
	mu   sync.Mutex
	all  []idem.Event
	grew chan struct{} // closed at the next event, for waitLen; nil if nobody waits
}

func (e *events) observe(ev idem.Event) {
	e.mu.Lock()
	e.all = append(e.all, ev)
	if e.grew != nil {
		close(e.grew)
		e.grew = nil
	}
	e.mu.Unlock()
}

// waitLen waits until at least n events were observed or timeout passed,
// and returns the outcomes so far.
func (e *events) waitLen(n int, timeout time.Duration) []idem.Outcome {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		e.mu.Lock()
		if len(e.all) >= n {
			e.mu.Unlock()
			return e.outcomes()
		}
		if e.grew == nil {
			e.grew = make(chan struct{})
		}
		grew := e.grew
		e.mu.Unlock()
		select {
		case <-grew:
		case <-t.C:
			return e.outcomes()
		}
	}
}

func (e *events) outcomes() []idem.Outcome {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]idem.Outcome, len(e.all))
	for i, ev := range e.all {
		out[i] = ev.Outcome
	}
	return out
}

// list returns a copy of the events so far.
func (e *events) list() []idem.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]idem.Event(nil), e.all...)
}

func (e *events) first() idem.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.all) == 0 {
		return idem.Event{}
	}
	return e.all[0]
}

func (e *events) last() idem.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.all) == 0 {
		return idem.Event{}
	}
	return e.all[len(e.all)-1]
}
