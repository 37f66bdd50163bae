package redisstore

import (
	"context"
	"errors"

	"github.com/idemkit/idem/storage/internal/redisproto"
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
// with [errors.Is]. It is the very value rueidisstore.ErrEvictionPolicy
// is.
var ErrEvictionPolicy = redisproto.ErrEvictionPolicy

// ErrRedisVersion means that the Redis server (on a cluster or a ring:
// one of its masters or shards) is older than 7.0, which the store
// needs: an Acquire is one SET key value NX PX ms GET, and Redis 6.2
// refuses NX with GET. The policy check (see [New]) reads the version
// too (INFO's redis_version), and every operation that starts new work
// (Acquire, AcquireIssued, Issue) then fails with an error that wraps
// ErrRedisVersion and names the version ("idem's Redis stores need Redis
// 7.0 or newer (SET NX GET); the server is 6.2.14"), and changes
// nothing: a request gets the middleware's 503, never a wrong answer.
// With [WithEvictionAllowed] nothing is checked, and an Acquire that the
// server refuses as a syntax error fails with an error wrapping
// ErrRedisVersion. A server that does not tell its version (miniredis, an
// INFO refused by an ACL) is taken for a recent one. It is the very value
// rueidisstore.ErrRedisVersion is.
var ErrRedisVersion = redisproto.ErrRedisVersion

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
func WithEvictionAllowed() Option { return func(s *Store) { s.guard.Off = true } }

// askPolicy asks every server behind the client for its maxmemory-policy
// and its version: each master of a ClusterClient, each shard of a Ring
// that is up, or the one server of any other client, and gives the
// verdict (see [redisproto.Tally]).
func (s *Store) askPolicy(ctx context.Context) (refusal error, ok bool) {
	t := redisproto.Tally{Pkg: "redisstore"}
	ask := func(ctx context.Context, c redis.Cmdable, node string) error {
		p, v, err := policyOf(ctx, c)
		t.Add(p, node, err)
		t.Version(v, node)
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
	return t.Verdict(err) // err: the cluster's layout could not be loaded
}

// policyOf sends INFO default (the default sections, which hold both fields,
// on every version) and returns the maxmemory_policy and redis_version
// fields of the answer, each "" when the server does not tell: the field
// is missing, or it refuses the command for good (NOPERM from an ACL, an
// unknown or renamed INFO: any error reply but the transient ones). It
// returns an error when the server could not be asked: a network error, a
// timeout, or a transient error reply (LOADING, BUSY, TRYAGAIN,
// MASTERDOWN, CLUSTERDOWN).
func policyOf(ctx context.Context, c redis.Cmdable) (policy, version string, err error) {
	info, err := c.Info(ctx, "default").Result()
	var reply redis.Error
	switch {
	case err == nil:
		return redisproto.ParsePolicy(info), redisproto.ParseVersion(info), nil
	case errors.As(err, &reply) && !errors.Is(err, redis.Nil) && !redisproto.Transient(reply.Error()):
		return "", "", nil
	}
	return "", "", err
}
