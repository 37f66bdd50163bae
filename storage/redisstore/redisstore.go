// Package redisstore is a [storage.Store] on Redis, shared by every
// instance of a service. It works with any redis.UniversalClient:
// redis.Client, redis.ClusterClient and redis.FailoverClient.
//
// Each operation is one Lua script on one key, run through redis.Script
// (EVALSHA, with EVAL when the script is not cached), so it is atomic, costs
// one round trip and routes to the right cluster node. Every key carries a
// TTL, sent in milliseconds.
//
// # Layout
//
// An entry is one Redis string under prefix+key: a state byte ('P' while
// processing, 'D' when done), one byte with the fingerprint's length, the
// fingerprint, then the owner token (processing) or the record (done).
package redisstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/storage"
	"github.com/redis/go-redis/v9"
)

// DefaultPrefix is the prefix of every key the store writes.
const DefaultPrefix = "idem:"

// Store is a storage.Store on Redis. Create it with [New].
type Store struct {
	rdb    redis.UniversalClient
	prefix string
}

var _ storage.Store = (*Store)(nil)

// Option configures a Store.
type Option func(*Store)

// WithPrefix sets the prefix of every key. Default "idem:". To keep all of
// one application's keys on one Redis Cluster slot you could use a hash
// tag such as "{idem}:", but this is rarely wanted: spreading keys across
// slots spreads the load.
func WithPrefix(p string) Option { return func(s *Store) { s.prefix = p } }

// New returns a Store that keeps its entries in rdb.
//
// go-redis's defaults suit batch work, not a request path: the context's
// deadline is ignored (ContextTimeoutEnabled is false) and with Redis down
// every call takes about 1.7 s to fail, with up to 3 retries. For a web
// service set ContextTimeoutEnabled, dial, read and write timeouts of a few
// hundred milliseconds and MaxRetries of 1 or 2, so that a request gets its
// 503 quickly while Redis is unreachable:
//
//	rdb := redis.NewClient(&redis.Options{
//		Addr:                  "localhost:6379",
//		ContextTimeoutEnabled: true,
//		DialTimeout:           250 * time.Millisecond,
//		ReadTimeout:           250 * time.Millisecond,
//		WriteTimeout:          250 * time.Millisecond,
//		MaxRetries:            1,
//	})
//
// Retries are safe: every script gives the same result when run twice.
func New(rdb redis.UniversalClient, opts ...Option) *Store {
	s := &Store{rdb: rdb, prefix: DefaultPrefix}
	for _, o := range opts {
		if o != nil {
			o(s)
		}
	}
	return s
}

// Result codes the scripts return.
const (
	codeAcquired = 1
	codeInFlight = 2
	codeDone     = 3
	codeOK       = 1
	codeNotOwner = 0
)

// acquire: KEYS[1]; ARGV owner, fingerprint, lease ms.
var acquireScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then
  redis.call('SET', KEYS[1], 'P' .. string.char(#ARGV[2]) .. ARGV[2] .. ARGV[1], 'PX', ARGV[3])
  return {1}
end
local n = string.byte(v, 2)
if n == nil or #v < 2 + n then
  return redis.error_reply('idem: malformed entry')
end
local fp = string.sub(v, 3, 2 + n)
local tag = string.sub(v, 1, 1)
if tag == 'P' then
  if string.sub(v, 3 + n) == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    return {1}
  end
  return {2, fp, redis.call('PTTL', KEYS[1])}
elseif tag == 'D' then
  return {3, fp, string.sub(v, 3 + n)}
end
return redis.error_reply('idem: malformed entry')
`)

// complete: KEYS[1]; ARGV owner, record, ttl ms.
var completeScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local n = string.byte(v, 2)
if n == nil or #v < 2 + n then
  return redis.error_reply('idem: malformed entry')
end
local tag = string.sub(v, 1, 1)
if tag == 'D' then
  if string.sub(v, 3 + n) == ARGV[2] then return 1 end
  return 0
end
if tag ~= 'P' or string.sub(v, 3 + n) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], 'D' .. string.sub(v, 2, 2 + n) .. ARGV[2], 'PX', ARGV[3])
return 1
`)

// release: KEYS[1]; ARGV owner.
var releaseScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then return 1 end
local n = string.byte(v, 2)
if string.sub(v, 1, 1) == 'P' and n ~= nil and string.sub(v, 3 + n) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
`)

// extend: KEYS[1]; ARGV owner, lease ms.
var extendScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local n = string.byte(v, 2)
if string.sub(v, 1, 1) == 'P' and n ~= nil and string.sub(v, 3 + n) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
`)

// ms gives d in whole milliseconds, rounded up: never 0, which PEXPIRE
// would take as "delete now".
func ms(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

func invalid(what string) error { return fmt.Errorf("redisstore: %w: %s", storage.ErrInvalid, what) }

var errReply = errors.New("redisstore: unexpected reply")

// Acquire implements storage.Store.
func (s *Store) Acquire(ctx context.Context, key, owner, fingerprint string, lease time.Duration) (storage.Result, error) {
	if err := storage.CheckAcquire(key, owner, fingerprint, lease); err != nil {
		return storage.Result{}, fmt.Errorf("redisstore: %w", err)
	}
	v, err := acquireScript.Run(ctx, s.rdb, []string{s.prefix + key}, owner, fingerprint, ms(lease)).Slice()
	if err != nil {
		return storage.Result{}, fmt.Errorf("redisstore: acquire: %w", err)
	}
	code, ok := int64At(v, 0)
	switch {
	case ok && code == codeAcquired && len(v) == 1:
		return storage.Result{State: storage.Acquired}, nil
	case ok && code == codeInFlight && len(v) == 3:
		fp, ok1 := v[1].(string)
		left, ok2 := int64At(v, 2)
		if ok1 && ok2 {
			return storage.Result{State: storage.InFlight, Fingerprint: fp, LeaseLeft: max(time.Duration(left)*time.Millisecond, time.Millisecond)}, nil
		}
	case ok && code == codeDone && len(v) == 3:
		fp, ok1 := v[1].(string)
		rec, ok2 := v[2].(string)
		if ok1 && ok2 {
			return storage.Result{State: storage.Done, Fingerprint: fp, Record: []byte(rec)}, nil
		}
	}
	return storage.Result{}, fmt.Errorf("%w to acquire: %v", errReply, v)
}

func int64At(v []any, i int) (int64, bool) {
	if i >= len(v) {
		return 0, false
	}
	n, ok := v[i].(int64)
	return n, ok
}

// run runs an owner-checked script and maps its 1/0 answer.
func (s *Store) run(ctx context.Context, op string, script *redis.Script, key string, args ...any) error {
	n, err := script.Run(ctx, s.rdb, []string{s.prefix + key}, args...).Int64()
	switch {
	case err != nil:
		return fmt.Errorf("redisstore: %s: %w", op, err)
	case n == codeOK:
		return nil
	case n == codeNotOwner:
		return fmt.Errorf("redisstore: %s: %w", op, storage.ErrNotOwner)
	}
	return fmt.Errorf("%w to %s: %d", errReply, op, n)
}

// Complete implements storage.Store.
func (s *Store) Complete(ctx context.Context, key, owner string, record []byte, ttl time.Duration) error {
	if ttl <= 0 {
		return invalid("ttl not positive")
	}
	return s.run(ctx, "complete", completeScript, key, owner, record, ms(ttl))
}

// Release implements storage.Store.
func (s *Store) Release(ctx context.Context, key, owner string) error {
	return s.run(ctx, "release", releaseScript, key, owner)
}

// Extend implements storage.Store.
func (s *Store) Extend(ctx context.Context, key, owner string, lease time.Duration) error {
	if lease <= 0 {
		return invalid("lease not positive")
	}
	return s.run(ctx, "extend", extendScript, key, owner, ms(lease))
}
