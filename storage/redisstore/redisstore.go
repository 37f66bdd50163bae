// Package redisstore is a [storage.Store] on Redis, shared by every
// instance of a service:
//
//	store := redisstore.New(rdb)
//	m, err := idem.New(store)
//
// It works with any redis.UniversalClient (redis.Client, redis.ClusterClient,
// redis.FailoverClient) unchanged.
//
// Each operation is one Lua script on one key, a redis.Script run the way
// Script.Run does (EVALSHA, then EVAL when the server does not have the
// script cached; the EVALSHA command is built here, with fewer allocations
// than Script.Run needs), so
// it is atomic, costs one round trip once the script is cached, and routes
// to the right Redis Cluster node: a script touches KEYS[1] only. Every key
// carries a TTL, sent in milliseconds and rounded up (never 0, which
// PEXPIRE takes as "delete now"). Every script gives the same answer when
// run twice, so go-redis's retries after a timeout are harmless, except
// Issue's: run twice, it answers [storage.ErrExists] the second time, as
// the contract asks of an Issue of a key that has an entry (the key is
// issued all the same).
//
// # Eviction
//
// The server must not evict the store's keys: its maxmemory-policy must be
// noeviction (Redis's default). Under any other policy every key of the
// store may be evicted under memory pressure, and a duplicate request
// would then run the handler again, so the store checks the policy at its
// first use and about once a minute after that, and refuses to start new
// work, with [ErrEvictionPolicy], while it evicts: Acquire, AcquireIssued
// and Issue are refused. Complete, Release and Extend are never refused:
// they finish an execution that has started (possibly before the policy
// changed), and refusing them would lose its record, so that the retry
// ran it again. See [New]. A Redis shared with
// other applications that want eviction (a cache) cannot serve the store:
// the policy and maxmemory are the server's, for all its databases, so
// give the store a server of its own. [WithEvictionAllowed] opts out.
//
// # Inspection
//
// The store is a [storage.Inspector]: [Store.Lookup] and [Store.Remove]
// are one script on one key, [Store.List] pages through the keys under the
// prefix with SCAN (every master of a Cluster, every shard of a Ring), two
// round trips a page, safe on a server with millions of keys. Grant the
// client's ACL user +scan and +time for them.
//
// # Layout
//
// An entry is one Redis string under prefix+key: a stamp, then the entry:
//
//	'T' since                                                 the stamp
//	'P' len(fingerprint) fingerprint owner                    while processing
//	'Q' len(fingerprint) fingerprint len(ttl) ttl owner       while processing, taken from an issue
//	'C' len(fingerprint) fingerprint len(owner) owner record  when done
//	'I' ttl                                                   when issued
//	'D' len(fingerprint) fingerprint record                   when done, written by an older release, unstamped
//
// The stamp holds when the entry entered its state, by the server's clock
// (TIME): since is the Unix time in milliseconds, in 6 bytes, most
// significant first (7 bytes in all: a stored record of a few hundred
// bytes stays in its allocation class). A renewal (Extend, an Acquire
// resent) keeps it; [Store.Lookup] and [Store.List] show it as
// [storage.Entry.Since]. Entries written by releases before the stamp
// have none: this release reads them all the same, and shows a zero
// Since.
//
// The state is one byte, 'P', 'Q', 'C', 'I' or 'D'; the fingerprint's
// length is one byte (a fingerprint has at most
// [storage.MaxFingerprintLen] bytes); the owner token or the record takes
// the rest of the value. ttl is the TTL given to [Store.Issue], in
// milliseconds, in decimal digits (without a leading zero; at most 15),
// after its length in one byte in a 'Q' entry: [Store.Release] turns a
// 'Q' entry back into 'I' ttl, for ttl milliseconds. A done entry keeps
// the owner that completed it: len(owner) in a 'C' entry is an unsigned
// varint (7 bits a byte, least significant first, as encoding/binary's
// Uvarint; one byte for an owner of up to 127 bytes, such as the
// middleware's 32-character tokens, so a done entry is 1+len(owner) bytes
// longer than it would be without) of at most 5 bytes, never 0. A value of
// any other shape (or a key of another type) makes every operation on it
// fail with an error, and changes nothing.
//
// [Store.Complete] on a done entry answers nil (a resend) only when both
// the owner and the record are the ones it holds, and
// [storage.ErrNotOwner] otherwise, changing nothing: an owner whose lease
// ran out, and whose execution ran again under another owner, is told so
// even when both produced the same record.
//
// Releases before the owner was kept wrote done entries as 'D' entries,
// without the owner. This one reads them as done entries all the same:
// Acquire and AcquireIssued replay them, Release and Extend answer
// ErrNotOwner, Issue ErrExists. Complete on a 'D' entry always answers
// ErrNotOwner, even with the very record it holds, and changes nothing:
// it cannot prove that its owner wrote it (and a process of this release
// never writes a 'D' entry, so its own resend never meets one).
//
// An older release of this package answers an error for each entry of a
// state it does not know (while versions are mixed during a rolling
// deploy, say): one from before issued keys for 'Q' and 'I' entries, one
// from before done entries kept their owner for 'C' entries, and one from
// before the stamp for every entry this release writes, which it then
// neither replays nor runs again (the middleware answers with its store
// error, 503, which clients retry) until an instance of this release
// serves the request. No request runs twice for it, but while both
// releases serve, the older one answers 503 to every request whose key
// the newer one wrote: deploy this release to every instance at once, or
// accept those retries for the length of the rollout.
package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/idemkit/idem/storage"
	"github.com/redis/go-redis/v9"
)

// DefaultPrefix is the prefix of every key the store writes unless
// WithPrefix says otherwise.
const DefaultPrefix = "idem:"

// Store is a storage.Store on Redis. Create it with [New]; the zero value
// is not usable. It is safe for concurrent use.
type Store struct {
	rdb    redis.UniversalClient
	prefix string
	policy
}

var (
	_ storage.Store  = (*Store)(nil)
	_ storage.Issuer = (*Store)(nil)
)

// Option configures a Store.
type Option func(*Store)

// WithPrefix sets the prefix of every key, [DefaultPrefix] by default. An
// empty prefix is allowed. Give each application sharing a Redis its own
// prefix. A hash tag such as "{idem}:" would put all keys on one Redis
// Cluster slot, which is rarely wanted: the middleware's keys are hashes,
// and spreading them across slots spreads the load.
func WithPrefix(p string) Option { return func(s *Store) { s.prefix = p } }

// New returns a Store that keeps its entries in rdb. It sends nothing to
// Redis until used.
//
// # Eviction
//
// The store refuses to start new work on a Redis that may evict its keys:
// an evicted in-flight entry lets a duplicate request run the handler
// again. Only the operations that start new work check the policy:
// Acquire, AcquireIssued and Issue ("operation" below means one of
// these). The first one asks the server for its maxmemory-policy (INFO
// memory: one round trip, or one per master of a redis.ClusterClient,
// sent in parallel, or per shard of a redis.Ring) and waits for the
// answer; from then on the verdict stands for about a minute, after which
// the next operation starts a check in the background and goes on with
// the old verdict without waiting. At most one check is in flight; no
// goroutine outlives it. While the verdict says the server may evict,
// every operation fails with an error wrapping [ErrEvictionPolicy] that
// names the policy, without sending its script. So a policy changed at
// run time (CONFIG SET) is noticed within about a minute, either way.
//
// Complete, Release and Extend never check the policy, never wait for a
// check and are never refused: whatever the verdict, they send their
// script. They finish an execution that has started, possibly before the
// policy changed: refused, its lease would run out and its record be
// lost, and the retry would run the handler again, which is what the
// check is there to prevent. A record stored while the server may evict
// may be evicted later; it is replayed while it lasts, but only once
// Acquire is allowed again (a replay is an Acquire, refused like any
// other while the policy is bad).
//
//   - Any policy other than noeviction is refused, also with maxmemory 0
//     (no limit, so nothing is evicted yet): a limit can be set at any
//     time, and noeviction then costs nothing.
//   - A server that does not report a policy is not refused: an INFO
//     answer without the maxmemory_policy field (miniredis answers INFO
//     memory with an error), an INFO refused with NOPERM by an ACL, or
//     an unknown or renamed INFO command. The verdict allows, and stands
//     like any other. Grant +info to the client's ACL user for the check
//     to work.
//   - A check that could not be made (a network error or a timeout, a
//     transient error reply such as LOADING, a master of a cluster that
//     does not answer) gives no verdict: an older verdict stands, and the
//     next operation starts another check. Before the first verdict, each
//     operation waits for a check (or for its context to end, and then
//     returns the context's error) and, when that check fails, goes on
//     and succeeds or fails on its own; while Redis is unreachable before
//     the first verdict, an operation thus takes up to twice as long to
//     fail.
//
// [WithEvictionAllowed] turns the check off.
//
// go-redis's defaults suit batch work, not a request path: the context's
// deadline is ignored (ContextTimeoutEnabled is false), reads wait up to
// 3 s, and with Redis down each call takes about 1.7 s to fail after its 3
// retries. For a web service, set ContextTimeoutEnabled and timeouts of a
// few hundred milliseconds and few retries, so that a request gets its 503
// quickly while Redis is unreachable:
//
//	rdb := redis.NewClient(&redis.Options{
//		Addr:                  "localhost:6379",
//		ContextTimeoutEnabled: true,                   // honour the request's deadline
//		DialTimeout:           250 * time.Millisecond, // default 5 s
//		ReadTimeout:           250 * time.Millisecond, // default 3 s
//		WriteTimeout:          250 * time.Millisecond, // default 3 s
//		MaxRetries:            1,                      // default 3
//		DialerRetries:         1,                      // default 5
//	})
//
// [ClientOptions] returns exactly these options. The same fields exist in
// redis.ClusterOptions, redis.FailoverOptions and redis.UniversalOptions.
// Retries are safe: every script gives the same answer when run twice,
// but Issue's, whose retry may answer [storage.ErrExists] for the key it
// issued.
func New(rdb redis.UniversalClient, opts ...Option) *Store {
	s := &Store{rdb: rdb, prefix: DefaultPrefix, policy: policy{every: policyCheckEvery, now: time.Now}}
	for _, o := range opts {
		if o != nil {
			o(s)
		}
	}
	return s
}

var (
	// errCorrupt: the key holds something that is not an entry of this
	// store.
	errCorrupt = errors.New("value is not an idem entry")
	// errReply: a script answered something it never answers.
	errReply = errors.New("unexpected reply")
)

// parseLua, the start of every script, splits a value into its state,
// fingerprint, rest (owner or record), issue TTL and done entry's owner,
// or returns nil when the value is not an entry (a processing entry must
// have an owner, and so must a 'C' entry). A 'P' entry and a 'Q' entry
// (taken from an issue) both come out as 'P', the 'Q' one with its issue
// TTL, the others without; a 'C' entry and a 'D' entry (the previous
// release's, without the owner) both come out as 'D', with the record as
// rest, the 'C' one with its owner, the 'D' one without; an 'I' entry
// comes out with empty fingerprint and rest. A TTL is a string of 1 to 15
// decimal digits without a leading zero, kept as a string to be sent to
// PX as it is. uvarint reads the unsigned varint (7 bits a byte, least
// significant first, as Go's encoding/binary) of at most 5 bytes at i of
// s, and returns it and the index after it; uvarintOf writes one.
const parseLua = `
local function ttl(t)
  if #t <= 15 and string.find(t, '^[1-9][0-9]*$') then return t end
  return nil
end
local function uvarint(s, i)
  local x, mul = 0, 1
  for j = i, i + 4 do
    local b = string.byte(s, j)
    if b == nil then return nil end
    if b < 128 then return x + b * mul, j + 1 end
    x, mul = x + (b - 128) * mul, mul * 128
  end
  return nil
end
local function uvarintOf(x)
  local s = ''
  while x >= 128 do
    s = s .. string.char(128 + x % 128)
    x = math.floor(x / 128)
  end
  return s .. string.char(x)
end
local function parse(v)
  local b, since = 1, nil
  if string.sub(v, 1, 1) == 'T' then
    if #v < 8 then return nil end
    since, b = string.sub(v, 2, 7), 8
  end
  local tag = string.sub(v, b, b)
  if tag == 'I' then
    local t = ttl(string.sub(v, b + 1))
    if t then return 'I', '', '', t, nil, since end
    return nil
  end
  local n = string.byte(v, b + 1)
  if n == nil or #v < b + 1 + n then return nil end
  local fp, rest = string.sub(v, b + 2, b + 1 + n), string.sub(v, b + 2 + n)
  if tag == 'C' then
    local m, i = uvarint(rest, 1)
    if m == nil or m == 0 or #rest < i - 1 + m then return nil end
    return 'D', fp, string.sub(rest, i + m), nil, string.sub(rest, i, i - 1 + m), since
  elseif tag == 'D' and not since then
    return 'D', fp, rest
  elseif tag == 'P' and #rest > 0 then
    return 'P', fp, rest, nil, nil, since
  elseif tag == 'Q' then
    local m = string.byte(rest, 1)
    if m == nil or #rest < 2 + m then return nil end
    local t = ttl(string.sub(rest, 2, 1 + m))
    if t then return 'P', fp, string.sub(rest, 2 + m), t, nil, since end
  end
  return nil
end
local function stamped(e)
  local t = redis.call('TIME')
  local ms, b = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), ''
  for i = 1, 6 do
    b = string.char(ms % 256) .. b
    ms = math.floor(ms / 256)
  end
  return 'T' .. b .. e
end
local v = redis.call('GET', KEYS[1])
`

// Answers of the scripts. Acquire answers 1 (acquired), the done entry's
// whole value (a string, parsed by [doneResult]: one bulk string costs
// go-redis fewer allocations than a table), {2, fingerprint, pttl} (in
// flight) or 0 (corrupt); AcquireIssued the same, or 3 (not issued). The
// others answer one integer.
const (
	codeCorrupt  = -1
	codeNotOwner = 0
	codeOK       = 1
	codeExists   = 0 // Issue's answer when the key has an entry

	codeAcquireCorrupt = 0
	codeAcquired       = 1
	codeInFlight       = 2
	codeNotIssued      = 3
)

// takeLua, the rest of the acquire scripts once parseLua found an entry:
// an issued entry is taken, becoming a 'Q' entry that keeps the issue's
// TTL. ARGV owner, fingerprint, lease in ms.
const takeLua = `
local tag, fp, rest, t = parse(v)
if tag == 'I' then
  redis.call('SET', KEYS[1], stamped('Q' .. string.char(#ARGV[2]) .. ARGV[2] .. string.char(#t) .. t .. ARGV[1]), 'PX', ARGV[3])
  return 1
elseif tag == 'D' then
  return v
elseif tag == 'P' and rest == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
elseif tag == 'P' then
  return {2, fp, redis.call('PTTL', KEYS[1])}
end
return 0
`

// acquire: ARGV owner, fingerprint, lease in ms.
const acquireSrc = parseLua + `
if not v then
  redis.call('SET', KEYS[1], stamped('P' .. string.char(#ARGV[2]) .. ARGV[2] .. ARGV[1]), 'PX', ARGV[3])
  return 1
end
` + takeLua

// acquireIssued: ARGV owner, fingerprint, lease in ms. No entry: not
// issued, and nothing is written.
const acquireIssuedSrc = parseLua + `
if not v then return 3 end
` + takeLua

// issue: ARGV ttl in ms. An entry in any state: 0, nothing written.
const issueSrc = parseLua + `
if not v then
  redis.call('SET', KEYS[1], stamped('I' .. ARGV[1]), 'PX', ARGV[1])
  return 1
elseif parse(v) then
  return 0
end
return -1
`

// complete: ARGV owner, record, ttl in ms. A done entry: 1 (a resend)
// when it was completed by this owner with this record; 0 otherwise, and
// always for a 'D' entry, which does not tell its owner.
const completeSrc = parseLua + `
if not v then return 0 end
local tag, fp, rest, t, o = parse(v)
if tag == 'D' then
  if o == ARGV[1] and rest == ARGV[2] then return 1 end
  return 0
elseif tag == 'P' then
  if rest ~= ARGV[1] then return 0 end
  redis.call('SET', KEYS[1], stamped('C' .. string.char(#fp) .. fp .. uvarintOf(#ARGV[1]) .. ARGV[1] .. ARGV[2]), 'PX', ARGV[3])
  return 1
elseif tag == 'I' then
  return 0
end
return -1
`

// release: ARGV owner. An entry taken from an issue goes back to issued,
// for the issue's TTL; an issued entry is left alone (a resend).
const releaseSrc = parseLua + `
if not v then return 1 end
local tag, fp, rest, t = parse(v)
if tag == 'P' and rest == ARGV[1] then
  if t then
    redis.call('SET', KEYS[1], stamped('I' .. t), 'PX', t)
  else
    redis.call('DEL', KEYS[1])
  end
  return 1
elseif tag == 'I' then
  return 1
elseif tag then
  return 0
end
return -1
`

// extend: ARGV owner, lease in ms.
const extendSrc = parseLua + `
if not v then return 0 end
local tag, fp, rest = parse(v)
if tag == 'P' and rest == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
elseif tag then
  return 0
end
return -1
`

// ms gives d in whole milliseconds, rounded up, for a d > 0: never 0,
// which PEXPIRE takes as "delete now" and SET PX refuses.
func ms(d time.Duration) int64 {
	n := int64(d / time.Millisecond)
	if d%time.Millisecond != 0 {
		n++
	}
	return n
}

// call holds the arguments of one script call. go-redis sends args, whose
// boxed strings (key, owner, fingerprint) allocate one header each; the
// record and the lease or TTL are boxed as pointers into call, which does
// not allocate, and written through their MarshalBinary. Every argument
// still prints as its value in hooks that format commands (tracing, logs).
type call struct {
	args [7]any
	key  string
	rec  record
	n    millis
}

// record is a record as a script argument, written as is.
type record []byte

func (r *record) MarshalBinary() ([]byte, error) { return *r, nil }
func (r *record) String() string                 { return string(*r) }

// millis is a lease or TTL in milliseconds as a script argument.
type millis struct {
	ms  int64
	buf [20]byte
}

func (m *millis) MarshalBinary() ([]byte, error) { return strconv.AppendInt(m.buf[:0], m.ms, 10), nil }
func (m *millis) String() string                 { return strconv.FormatInt(m.ms, 10) }

// script is a Lua script and its EVALSHA digest, boxed once.
type script struct {
	*redis.Script
	sha any
}

func newScript(src string) script {
	s := redis.NewScript(src)
	return script{s, s.Hash()}
}

var (
	acquire       = newScript(acquireSrc)
	acquireIssued = newScript(acquireIssuedSrc)
	issue         = newScript(issueSrc)
	complete      = newScript(completeSrc)
	release       = newScript(releaseSrc)
	extend        = newScript(extendSrc)
)

// run runs sc with c's key and the given arguments (pointers into c), as
// redis.Script.Run does: EVALSHA, then EVAL when Redis answers NOSCRIPT.
func (s *Store) run(ctx context.Context, sc script, c *call, args ...any) (any, error) {
	c.args[0], c.args[1], c.args[2], c.args[3] = "evalsha", sc.sha, 1, c.key
	n := 4 + copy(c.args[4:], args)
	cmd := redis.NewCmd(ctx, c.args[:n]...)
	cmd.SetFirstKeyPos(3)
	err := s.rdb.Process(ctx, cmd)
	if err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT")) {
		return sc.Eval(ctx, s.rdb, []string{c.key}, c.args[4:n]...).Result()
	}
	if err != nil {
		return nil, err
	}
	return cmd.Result()
}

// ClientOptions returns the go-redis options recommended for a client that
// serves the middleware on a request path, for the server at addr: the
// request's context deadline honoured (ContextTimeoutEnabled), dial, read
// and write timeouts of 250 ms, one retry of a command (MaxRetries 1) and
// of a refused dial (DialerRetries 1). With them a request gets its 503
// within about half a second while Redis is unreachable, instead of
// seconds with go-redis's defaults. Change any field before use:
//
//	opt := redisstore.ClientOptions("localhost:6379")
//	opt.Password = os.Getenv("REDIS_PASSWORD")
//	store := redisstore.New(redis.NewClient(opt))
func ClientOptions(addr string) *redis.Options {
	return &redis.Options{
		Addr:                  addr,
		ContextTimeoutEnabled: true,
		DialTimeout:           250 * time.Millisecond,
		ReadTimeout:           250 * time.Millisecond,
		WriteTimeout:          250 * time.Millisecond,
		MaxRetries:            1,
		DialerRetries:         1,
	}
}

// Acquire implements [storage.Store.Acquire]; given an issued entry, it
// takes it as AcquireIssued does. Errors wrap
// [storage.ErrInvalid] or [ErrEvictionPolicy], or say that Redis could not
// be reached, failed, or holds a value under the key that is not an entry.
func (s *Store) Acquire(ctx context.Context, key, owner, fingerprint string, lease time.Duration) (storage.Result, error) {
	if err := storage.CheckAcquire(key, owner, fingerprint, lease); err != nil {
		return storage.Result{}, fmt.Errorf("redisstore: acquire: %w", err)
	}
	if err := s.checkPolicy(ctx); err != nil {
		return storage.Result{}, fmt.Errorf("redisstore: acquire: %w", err)
	}
	c := &call{key: s.prefix + key, n: millis{ms: ms(lease)}}
	reply, err := s.run(ctx, acquire, c, owner, fingerprint, &c.n)
	if err != nil {
		return storage.Result{}, fmt.Errorf("redisstore: acquire: %w", replyErr(err))
	}
	res, err := acquireResult(reply)
	if err != nil {
		return storage.Result{}, fmt.Errorf("redisstore: acquire %q: %w", c.key, err)
	}
	return res, nil
}

// AcquireIssued implements [storage.Issuer.AcquireIssued]. Errors wrap
// [storage.ErrInvalid] or [ErrEvictionPolicy], or say that Redis could not
// be reached, failed, or holds a value under the key that is not an entry.
func (s *Store) AcquireIssued(ctx context.Context, key, owner, fingerprint string, lease time.Duration) (storage.Result, error) {
	if err := storage.CheckAcquire(key, owner, fingerprint, lease); err != nil {
		return storage.Result{}, fmt.Errorf("redisstore: acquire issued: %w", err)
	}
	if err := s.checkPolicy(ctx); err != nil {
		return storage.Result{}, fmt.Errorf("redisstore: acquire issued: %w", err)
	}
	c := &call{key: s.prefix + key, n: millis{ms: ms(lease)}}
	reply, err := s.run(ctx, acquireIssued, c, owner, fingerprint, &c.n)
	if err != nil {
		return storage.Result{}, fmt.Errorf("redisstore: acquire issued: %w", replyErr(err))
	}
	res, err := acquireIssuedResult(reply)
	if err != nil {
		return storage.Result{}, fmt.Errorf("redisstore: acquire issued %q: %w", c.key, err)
	}
	return res, nil
}

// acquireIssuedResult maps the acquireIssued script's answer: the acquire
// script's, or 3 for not issued.
func acquireIssuedResult(reply any) (storage.Result, error) {
	if code, ok := reply.(int64); ok && code == codeNotIssued {
		return storage.Result{State: storage.NotIssued}, nil
	}
	return acquireResult(reply)
}

// Issue implements [storage.Issuer.Issue]. Errors wrap [storage.ErrExists],
// [storage.ErrInvalid] or [ErrEvictionPolicy], or say that Redis could not
// be reached, failed, or holds a value under the key that is not an entry.
// A command that go-redis resent after a timeout, once the first had
// issued the key, answers ErrExists.
func (s *Store) Issue(ctx context.Context, key string, ttl time.Duration) error {
	switch {
	case key == "":
		return fmt.Errorf("redisstore: issue: %w: empty key", storage.ErrInvalid)
	case ttl <= 0:
		return fmt.Errorf("redisstore: issue: %w: ttl %v", storage.ErrInvalid, ttl)
	}
	if err := s.checkPolicy(ctx); err != nil {
		return fmt.Errorf("redisstore: issue: %w", err)
	}
	c := &call{key: s.prefix + key, n: millis{ms: ms(ttl)}}
	reply, err := s.run(ctx, issue, c, &c.n)
	if err != nil {
		return fmt.Errorf("redisstore: issue: %w", replyErr(err))
	}
	if err := issueResult(reply); err != nil {
		return fmt.Errorf("redisstore: issue %q: %w", c.key, err)
	}
	return nil
}

// issueResult maps the issue script's answer.
func issueResult(reply any) error {
	code, ok := reply.(int64)
	switch {
	case ok && code == codeOK:
		return nil
	case ok && code == codeExists:
		return storage.ErrExists
	case ok && code == codeCorrupt:
		return errCorrupt
	}
	return unexpected(reply)
}

// acquireResult maps the acquire script's answer.
func acquireResult(reply any) (storage.Result, error) {
	switch v := reply.(type) {
	case int64:
		switch v {
		case codeAcquired:
			return storage.Result{State: storage.Acquired}, nil
		case codeAcquireCorrupt:
			return storage.Result{}, errCorrupt
		}
	case string:
		return doneResult(v)
	case []any:
		if len(v) != 3 {
			break
		}
		code, ok0 := v[0].(int64)
		fp, ok1 := v[1].(string)
		pttl, ok2 := v[2].(int64)
		if ok0 && ok1 && ok2 && code == codeInFlight {
			// PTTL is in whole ms and may read 0 in the entry's last
			// millisecond; the contract promises at least 1ms.
			left := max(time.Duration(pttl)*time.Millisecond, time.Millisecond)
			return storage.Result{State: storage.InFlight, Fingerprint: fp, LeaseLeft: left}, nil
		}
	}
	return storage.Result{}, unexpected(reply)
}

// doneResult parses the value of a done entry, as the acquire script
// returns it: 'C', the fingerprint's length, the fingerprint, the owner's
// length (a uvarint), the owner, the record; or 'D', the fingerprint's
// length, the fingerprint, the record. The fingerprint is a substring of
// v; the record is copied out of it.
func doneResult(v string) (storage.Result, error) {
	since, v, ok := cutStamp(v)
	if !ok || (since != "" && len(v) > 0 && v[0] == 'D') { // a 'D' entry is never stamped
		return storage.Result{}, unexpected(v)
	}
	if len(v) < 2 || (v[0] != 'C' && v[0] != 'D') || len(v) < 2+int(v[1]) {
		return storage.Result{}, unexpected(v)
	}
	n := 2 + int(v[1])
	fp, rest := v[2:n], v[n:]
	if v[0] == 'C' {
		m, k := uvarint(rest)
		if k <= 0 || m == 0 || uint64(len(rest)-k) < m {
			return storage.Result{}, unexpected(v)
		}
		rest = rest[k+int(m):]
	}
	return storage.Result{State: storage.Done, Fingerprint: fp, Record: []byte(rest)}, nil
}

// cutStamp splits a value into its stamp (the 6 bytes of a 'T' prefix;
// "" when it has none) and the entry after it. ok is false when v is too
// short for its stamp.
func cutStamp(v string) (since, e string, ok bool) {
	if len(v) == 0 || v[0] != 'T' {
		return "", v, true
	}
	if len(v) < 8 {
		return "", "", false
	}
	return v[1:7], v[7:], true
}

// stampTime reads the 6 bytes of a stamp: Unix milliseconds, most
// significant first. The zero Time for "" (no stamp).
func stampTime(since string) time.Time {
	if len(since) != 6 {
		return time.Time{}
	}
	var ms int64
	for i := range 6 {
		ms = ms<<8 | int64(since[i])
	}
	return time.UnixMilli(ms)
}

// uvarint reads the owner's length in a 'C' entry as the scripts do: a
// uvarint of at most 5 bytes. It returns the value and the bytes read, or
// k <= 0 when s does not start with one.
func uvarint(s string) (x uint64, k int) {
	for i := 0; i < len(s) && i < 5; i++ {
		b := s[i]
		x |= uint64(b&0x7f) << (7 * i)
		if b < 0x80 {
			return x, i + 1
		}
	}
	return 0, 0
}

// Complete implements [storage.Store.Complete]. The done entry keeps
// owner: a later Complete of it returns nil only for the same owner and
// record (a resend), and ErrNotOwner for any other owner, even with the
// same record, and for a done entry of an older release, which does not
// keep its owner (see the package doc's Layout). It is never refused for
// the server's maxmemory-policy (see [New]). Errors wrap
// [storage.ErrNotOwner] or [storage.ErrInvalid], or say that Redis could
// not be reached, failed, or holds a value under the key that is not an
// entry.
func (s *Store) Complete(ctx context.Context, key, owner string, rec []byte, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("redisstore: complete: %w: ttl %v", storage.ErrInvalid, ttl)
	}
	c := &call{key: s.prefix + key, rec: rec, n: millis{ms: ms(ttl)}}
	return s.owned(ctx, "complete", complete, c, owner, &c.rec, &c.n)
}

// Release implements [storage.Store.Release]: an entry taken from an issue
// goes back to the issued state, for the issue's whole TTL again; Release
// of an issued entry changes nothing and returns nil. It is never refused
// for the server's maxmemory-policy (see [New]). Errors wrap
// [storage.ErrNotOwner], or say that Redis could not be reached, failed,
// or holds a value under the key that is not an entry.
func (s *Store) Release(ctx context.Context, key, owner string) error {
	c := &call{key: s.prefix + key}
	return s.owned(ctx, "release", release, c, owner)
}

// Extend implements [storage.Store.Extend]. It is never refused for the
// server's maxmemory-policy (see [New]). Errors wrap
// [storage.ErrNotOwner] or [storage.ErrInvalid], or say that Redis could
// not be reached, failed, or holds a value under the key that is not an
// entry.
func (s *Store) Extend(ctx context.Context, key, owner string, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("redisstore: extend: %w: lease %v", storage.ErrInvalid, lease)
	}
	c := &call{key: s.prefix + key, n: millis{ms: ms(lease)}}
	return s.owned(ctx, "extend", extend, c, owner, &c.n)
}

// owned runs an owner-checked script and maps its answer. It does not
// check the maxmemory-policy: Complete, Release and Extend finish work
// that has started, and always send their script (see [New]).
func (s *Store) owned(ctx context.Context, op string, sc script, c *call, args ...any) error {
	reply, err := s.run(ctx, sc, c, args...)
	if err != nil {
		return fmt.Errorf("redisstore: %s: %w", op, replyErr(err))
	}
	if err := ownedResult(reply); err != nil {
		return fmt.Errorf("redisstore: %s %q: %w", op, c.key, err)
	}
	return nil
}

// ownedResult maps the answer of an owner-checked script.
func ownedResult(reply any) error {
	code, ok := reply.(int64)
	switch {
	case ok && code == codeOK:
		return nil
	case ok && code == codeNotOwner:
		return storage.ErrNotOwner
	case ok && code == codeCorrupt:
		return errCorrupt
	}
	return unexpected(reply)
}

// replyErr maps redis.Nil, the answer to a script that returns Lua false
// or nil, which these scripts never do: it must not pass for "no entry".
func replyErr(err error) error {
	if errors.Is(err, redis.Nil) {
		return fmt.Errorf("%w: nil", errReply)
	}
	return err
}

// unexpected describes a reply by its shape only: it may hold a record of
// a megabyte.
func unexpected(reply any) error {
	if v, ok := reply.([]any); ok {
		return fmt.Errorf("%w: an array of %d", errReply, len(v))
	}
	return fmt.Errorf("%w: %T", errReply, reply)
}
