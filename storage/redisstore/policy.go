package redisstore

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrEvictionPolicy means that the Redis server (on a cluster or a ring:
// one of its masters or shards) reports a maxmemory-policy other than
// noeviction, under which it may evict the store's keys when it runs out
// of memory: an in-flight entry that vanishes lets a duplicate request run
// the handler again, and a done entry that vanishes lets a retry run it
// again too. Every operation of the store that starts new work (Acquire,
// AcquireIssued, Issue) then fails with an error that wraps
// ErrEvictionPolicy, names the policy and says what to do, and changes
// nothing, unless the store was made with [WithEvictionAllowed];
// Complete, Release and Extend are never refused (see [New]). Compare
// with [errors.Is].
var ErrEvictionPolicy = errors.New("redisstore: Redis maxmemory-policy may evict idempotency keys")

// policyCheckEvery is how long a verdict on the maxmemory-policy stands
// before the next operation starts a check in the background.
const policyCheckEvery = time.Minute

// policyCheckTimeout bounds one check, on top of the client's own
// timeouts: a check outlives the request that started it.
const policyCheckTimeout = 5 * time.Second

// WithEvictionAllowed turns off the check of the server's maxmemory-policy:
// the store then works on a Redis that may evict its keys. It is
// dangerous. Under memory pressure (from this application or from any
// other sharing the server) a Redis with an allkeys-* policy evicts any
// key, and one with a volatile-* policy any key with a TTL, which every
// key of this store has: an evicted in-flight entry lets a duplicate run
// the handler a second time while the first still runs, and an evicted
// done entry lets a retry run it again instead of replaying the response.
// The middleware cannot notice either. Use it only when a duplicate
// execution is acceptable, or when the server's memory is known never to
// reach its limit (and then noeviction costs nothing: prefer setting it).
func WithEvictionAllowed() Option { return func(s *Store) { s.evictionAllowed = true } }

// verdict is the outcome of a check of the maxmemory-policy.
type verdict struct {
	err error     // nil: operations may go on; else it wraps ErrEvictionPolicy
	at  time.Time // when it was reached (by Store.now)
}

// policy holds the state of the maxmemory-policy check of a Store.
type policy struct {
	evictionAllowed bool
	every           time.Duration    // policyCheckEvery; shortened by tests
	now             func() time.Time // time.Now; a fake clock in tests

	verdict atomic.Pointer[verdict] // the last verdict; nil before the first

	mu      sync.Mutex
	running chan struct{} // closed when the check in flight ends; nil when none
}

// checkPolicy returns the error every operation that starts new work
// (Acquire, AcquireIssued, Issue; the only ones that call it) fails with
// while the last verdict says the server may evict, and nil otherwise. It costs no round
// trip while the verdict is fresh (younger than every). With a stale
// verdict it starts a check in the background, unless one is in flight,
// and answers with the stale verdict at once. With no verdict at all (the
// store's first use, or every check so far failed) it starts a check,
// unless one is in flight, and waits for it, or for ctx to end, whose
// error it then returns. A check that failed gives no verdict, and the
// operation goes on: see [New].
func (s *Store) checkPolicy(ctx context.Context) error {
	if s.evictionAllowed {
		return nil
	}
	v := s.verdict.Load()
	if v != nil && s.now().Sub(v.at) < s.every {
		return v.err
	}
	done := s.startCheck(ctx)
	if v != nil {
		return v.err
	}
	select {
	case <-done:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	if v := s.verdict.Load(); v != nil {
		return v.err
	}
	return nil
}

// closed is a channel that is closed: no check needed.
var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// startCheck returns a channel closed when the check in flight ends,
// starting one if none is in flight and the verdict is not fresh. At most
// one check runs at a time. The check runs on a goroutine of its own,
// which ends when the check does (it is bounded by policyCheckTimeout and
// the client's timeouts), so that a request waiting for it can give up at
// its deadline, and one that does not wait is not slowed down.
func (s *Store) startCheck(ctx context.Context) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running != nil {
		return s.running
	}
	if v := s.verdict.Load(); v != nil && s.now().Sub(v.at) < s.every {
		return closed // another check ended since the caller looked
	}
	done := make(chan struct{})
	s.running = done
	// The check keeps ctx's values (for tracing hooks), not its deadline
	// or cancellation: it serves later operations too.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), policyCheckTimeout)
	go func() {
		defer close(done)
		defer cancel()
		v, ok := s.check(ctx)
		s.mu.Lock()
		defer s.mu.Unlock()
		if ok {
			v.at = s.now()
			s.verdict.Store(v)
		}
		s.running = nil
	}()
	return done
}

// check asks every server behind the client for its maxmemory-policy: each
// master of a ClusterClient, each shard of a Ring that is up, or the one
// server of any other client. It returns a verdict that refuses when any
// of them reports an evicting policy (even if others could not be asked),
// one that allows when every one of them answered without (noeviction, or
// no policy reported), and ok false (no verdict) when some could not be
// asked, or none was (a ring with every shard down), and none refuses.
func (s *Store) check(ctx context.Context) (v *verdict, ok bool) {
	var (
		mu      sync.Mutex
		asked   int
		evicts  error
		unknown error
	)
	ask := func(ctx context.Context, c redis.Cmdable, node string) error {
		p, err := askPolicy(ctx, c)
		mu.Lock()
		defer mu.Unlock()
		asked++
		switch {
		case err != nil:
			unknown = err
		case p != "" && p != "noeviction" && evicts == nil:
			evicts = &policyError{policy: p, node: node}
		}
		return nil
	}
	var err error
	switch c := s.rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			return ask(ctx, n, "master "+n.Options().Addr)
		})
	case *redis.Ring:
		err = c.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error {
			return ask(ctx, n, "shard "+n.Options().Addr)
		})
	default:
		err = ask(ctx, s.rdb, "")
	}
	switch {
	case evicts != nil:
		return &verdict{err: evicts}, true
	case err != nil || unknown != nil || asked == 0: // err: the cluster's layout could not be loaded
		return nil, false
	}
	return &verdict{}, true
}

// askPolicy sends INFO memory and returns the maxmemory_policy field of the
// answer (also reported on managed services where CONFIG GET is
// disabled), or "" when the server does not tell: the field is missing, or
// it refuses the command for good (NOPERM from an ACL, an unknown or
// renamed INFO, a section it does not know: any error reply but the
// transient ones). It returns an error when the server could not be asked:
// a network error, a timeout, or a transient error reply (LOADING, BUSY,
// TRYAGAIN, MASTERDOWN, CLUSTERDOWN).
func askPolicy(ctx context.Context, c redis.Cmdable) (string, error) {
	info, err := c.Info(ctx, "memory").Result()
	var reply redis.Error
	switch {
	case err == nil:
		return parsePolicy(info), nil
	case errors.As(err, &reply) && !errors.Is(err, redis.Nil) && !transient(err):
		return "", nil
	}
	return "", err
}

// transient reports an error reply that a server gives only for a while.
func transient(err error) bool {
	for _, p := range []string{"LOADING", "BUSY", "TRYAGAIN", "MASTERDOWN", "CLUSTERDOWN"} {
		if redis.HasErrorPrefix(err, p) {
			return true
		}
	}
	return false
}

// parsePolicy returns the value of the maxmemory_policy line of an INFO
// answer, or "" when there is none.
func parsePolicy(info string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(line, "maxmemory_policy:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// policyError is the verdict that refuses: it wraps ErrEvictionPolicy and
// says which policy, on which node, and what to do.
type policyError struct {
	policy string
	node   string // "master host:port" on a cluster, "shard ..." on a ring, "" otherwise
}

func (e *policyError) Error() string {
	on := ""
	if e.node != "" {
		on = " on " + e.node
	}
	return "Redis maxmemory-policy is " + e.policy + on +
		": it may evict idempotency locks and records; set maxmemory-policy noeviction" +
		" (or give the store a Redis of its own with noeviction) or opt out with redisstore.WithEvictionAllowed"
}

func (e *policyError) Is(target error) bool { return target == ErrEvictionPolicy }
