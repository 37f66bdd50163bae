// Package redisstore is a [storage.Store] on Redis, shared by every
// instance of a service:
//
//	store := redisstore.New(rdb)
//	m, err := idem.New(store)
//
// It works with any redis.UniversalClient (redis.Client, redis.ClusterClient,
// redis.FailoverClient) unchanged.
//
// It needs Redis 7.0 or newer, and says so (see [ErrRedisVersion]).
//
// Each operation is one command on one key, so it is atomic, costs one
// round trip and routes to the right Redis Cluster node. An Acquire is a
// SET key value NX PX lease GET, which makes the in-flight entry or
// answers the one there (a replay costs Redis about what a GET does);
// only another owner's entry costs a second command (PTTL, for the lease
// left), and an issued entry or the owner's own (a resent Acquire) the
// Acquire script. On Valkey 8.1 and newer (and Redis 8.4 and newer),
// Complete and the renewal of a lease (Extend) are one plain command too:
// SET key value IFEQ current PX ms, a native compare-and-set that
// replaces the owner's in-flight entry only where it is still there as
// the store's own Acquire wrote it (the store remembers those it wrote,
// at most 65,536 at a time, each until its lease ends). The first such
// command is the probe: a server that does not know IFEQ refuses it as
// a syntax error, writing nothing, and the store then sends the scripts
// alone, and tries again a minute later (a server upgraded in place is
// found without a restart). The entries are the same either way, so
// instances of this release and of older ones share a server during a
// rolling upgrade. The other operations (and Complete and Extend where
// the native command cannot decide: a resend, a lease that ran out, an
// entry taken from an issue: a second command then) are Lua scripts on
// KEYS[1] only,
// run the way redis.Script.Run does (EVALSHA, then EVAL when the server
// does not have the script cached; the EVALSHA command is built here,
// with fewer allocations than Script.Run needs). Every key carries a
// TTL, sent in milliseconds and rounded up (never 0, which PEXPIRE takes
// as "delete now"). Every command gives the same answer when sent twice,
// so go-redis's retries after a timeout are harmless (an Acquire resent
// after its first made the entry finds the owner's own entry, and renews
// it), except Issue's: run twice, it answers [storage.ErrExists] the
// second time, as the contract asks of an Issue of a key that has an
// entry (the key is issued all the same).
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
// The layout, the scripts and the policy check are shared with
// rueidisstore, the store on the rueidis client: an entry written by one
// is read by the other, so a service may move from one to the other, or
// run both while it does. An entry is one Redis string under prefix+key:
// a stamp, then the entry:
//
//	'T' since                                                 the stamp
//	'P' len(fingerprint) fingerprint owner                    while processing
//	'Q' len(fingerprint) fingerprint len(ttl) ttl owner       while processing, taken from an issue
//	'C' len(fingerprint) fingerprint len(owner) owner record  when done
//	'I' ttl                                                   when issued
//	'D' len(fingerprint) fingerprint record                   when done, written by an older release, unstamped
//
// The stamp holds when the entry entered its state, by the clock of the
// instance that wrote it (releases before the Acquire was a SET NX GET
// used the server's TIME; the layout is the same): since is the Unix time
// in milliseconds, in 6 bytes, most significant first (7 bytes in all: a
// stored record of a few hundred bytes stays in its allocation class). A renewal (Extend, an Acquire
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
	"sync"
	"time"

	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/internal/redisproto"
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
	guard  redisproto.Guard
	now    func() time.Time // the clock that stamps entries
	// maxRecord is the longest record Complete sends (WithMaxRecordBytes).
	maxRecord int
	// native is the native path (SET IFEQ) and the entries it holds.
	native redisproto.Native
	// hot is the keys found done lately, which Acquire reads with a GET.
	hot redisproto.Hot
	// durable is what Complete waits for (WithDurability).
	durable redisproto.Durability
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

// WithMaxRecordBytes bounds the records Complete keeps to n bytes,
// 512 MiB (Redis's default proto-max-bulk-len) by default; n <= 0 keeps
// the default. A longer record is refused before anything is sent, with
// an error wrapping [storage.ErrTooLarge], and the middleware then keeps
// the key done but not replayable (409 ErrNotReplayable, no second run).
// On a server whose proto-max-bulk-len is lowered, set n to at most that:
// the server refuses a longer argument by closing the connection, which
// the store cannot tell from an outage. The middleware's own
// WithMaxResponseBody (1 MiB by default) keeps records far smaller; this
// bounds the memory one entry takes on a Redis shared with applications
// that set it higher.
func WithMaxRecordBytes(n int) Option {
	return func(s *Store) {
		if n > 0 {
			s.maxRecord = n
		}
	}
}

// Durability is what Complete waits for once it wrote the done entry
// (see [WithDurability]): Replicas replicas (WAIT), or with AOF the
// append-only file's fsync on the primary and on Replicas replicas
// (WAITAOF, Redis 7.2 and newer, Valkey 8.0 and newer), for at most
// Timeout (100 ms when 0).
type Durability = redisproto.Durability

// WithDurability makes Complete wait, once it wrote the done entry, until
// the write is where d says (by default it waits for nothing: Redis
// replicates asynchronously, and a primary that fails before a replica
// has the record loses it, so that the retry runs again). The wait is
// one more command (WAIT or WAITAOF) on the connection that wrote, which
// the answer waits for: about a replica's round trip, at most d.Timeout.
// When the wait ends short of d (the timeout passed, or the wait itself
// failed), the record stands, the answer is still sent, and Complete
// returns an error wrapping [storage.ErrNotDurable], which the middleware
// takes as a stored record (it is not retried) and reports in the
// observer's Executed event. It needs a *redis.Client (NewClient,
// NewFailoverClient) or a *redis.ClusterClient, whose connection to the
// key's master it takes for the call; with any other client Complete
// fails with [storage.ErrInvalid]. A Complete that is a resend (its
// first's answer was lost) writes nothing, and its wait confirms what the
// replicas hold of that connection's writes, not of the first's.
func WithDurability(d Durability) Option { return func(s *Store) { s.durable = d } }

// New returns a Store that keeps its entries in rdb. It sends nothing to
// Redis until used.
//
// # Eviction
//
// The store refuses to start new work on a Redis that may evict its keys:
// an evicted in-flight entry lets a duplicate request run the handler
// again. Only the operations that start new work check the policy:
// Acquire, AcquireIssued and Issue ("operation" below means one of
// these). The first one asks the server for its maxmemory-policy and version (INFO
// default: one round trip, or one per master of a redis.ClusterClient,
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
//     default with an error), an INFO refused with NOPERM by an ACL, or
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
	s := &Store{rdb: rdb, prefix: DefaultPrefix, now: time.Now, maxRecord: redisproto.DefaultMaxRecord}
	s.guard.Ask = s.askPolicy
	for _, o := range opts {
		if o != nil {
			o(s)
		}
	}
	return s
}

// call holds the arguments of one script call. go-redis sends args, whose
// boxed strings (key, owner, fingerprint) allocate one header each; the
// record and the lease or TTL are boxed as pointers into call, which does
// not allocate, and written through their MarshalBinary. Every argument
// still prints as its value in hooks that format commands (tracing, logs).
type call struct {
	args  [9]any
	key   string
	rec   record
	n     millis
	val   record // the value of Acquire's SET, over buf
	stamp record // the stamp, over buf
	olen  record // the owner's length (Complete), over buf
	buf   [96]byte
	conn  *redis.Conn // the connection a durable Complete runs on; nil: the client's pool
}

// target is what a call's commands go through: the client, or one of its
// connections (a durable Complete's, see WithDurability).
type target interface {
	Process(ctx context.Context, cmd redis.Cmder) error
	redis.Scripter
}

// via returns c's target.
func (s *Store) via(c *call) target {
	if c.conn != nil {
		return c.conn
	}
	return s.rdb
}

// stamped sets c.stamp to the stamp of now.
func (c *call) stamped(now time.Time) *record {
	c.stamp = redisproto.AppendStamp(c.buf[:0], now)
	return &c.stamp
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

// script is a protocol script as go-redis runs it, with its EVALSHA
// digest boxed once.
type script struct {
	*redis.Script
	sha any
}

func newScript(p redisproto.Script) script { return script{redis.NewScript(p.Src), p.SHA} }

var (
	acquire       = newScript(redisproto.Acquire)
	acquireIssued = newScript(redisproto.AcquireIssued)
	issue         = newScript(redisproto.Issue)
	complete      = newScript(redisproto.Complete)
	release       = newScript(redisproto.Release)
	extend        = newScript(redisproto.Extend)
	inspect       = newScript(redisproto.Inspect)
)

// run runs sc with c's key and the given arguments (pointers into c), as
// redis.Script.Run does: EVALSHA, then EVAL when Redis answers NOSCRIPT.
// A nil reply (redis.Nil, which the scripts never give) is an unexpected
// reply: it must not pass for "no entry".
func (s *Store) run(ctx context.Context, sc script, c *call, args ...any) (redisproto.Reply, error) {
	c.args[0], c.args[1], c.args[2], c.args[3] = "evalsha", sc.sha, 1, c.key
	n := 4 + copy(c.args[4:], args)
	cmd := redis.NewCmd(ctx, c.args[:n]...)
	cmd.SetFirstKeyPos(3)
	via := s.via(c)
	err := via.Process(ctx, cmd)
	if noScript(err) {
		cmd = sc.Eval(ctx, via, []string{c.key}, c.args[4:n]...)
		err = cmd.Err()
	}
	if errors.Is(err, redis.Nil) {
		return redisproto.Reply{}, redisproto.Unexpected(redisproto.Reply{})
	}
	if err != nil {
		return redisproto.Reply{}, err
	}
	return redisproto.FromAny(cmd.Val()), nil
}

// noScript reports the answer to an EVALSHA of a script the server does
// not have cached.
func noScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
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
// takes it as AcquireIssued does. Errors wrap [storage.ErrInvalid],
// [ErrEvictionPolicy] or [ErrRedisVersion], or say that Redis could not
// be reached, failed, or holds a value under the key that is not an
// entry.
//
// It sends SET key value NX PX lease GET, which makes the processing
// entry or answers the one there, unchanged: a new key or a done one
// (a replay) costs that one command. A key that an Acquire found done
// lately (the last 4,096) is read with a GET first, which answers its
// replays at the cost of a GET (see redisproto.Hot); a GET that finds it
// no longer done costs that one more command. Another owner's processing entry
// costs a PTTL more, for its lease left; an issued entry, or the
// owner's own processing entry (a resent Acquire, whose lease is
// renewed), the Acquire script more.
func (s *Store) Acquire(ctx context.Context, key, owner, fingerprint string, lease time.Duration) (storage.Result, error) {
	const op = "acquire"
	if err := storage.CheckAcquire(key, owner, fingerprint, lease); err != nil {
		return storage.Result{}, fmt.Errorf("redisstore: %s: %w", op, err)
	}
	if err := s.guard.Check(ctx); err != nil {
		return storage.Result{}, fmt.Errorf("redisstore: %s: %w", op, err)
	}
	c := &call{key: s.prefix + key, n: millis{ms: redisproto.Millis(lease)}}
	if s.hot.Has(key) {
		get := redis.NewStringCmd(ctx, "get", c.key)
		get.SetFirstKeyPos(1)
		err := s.rdb.Process(ctx, get)
		if res, ok := redisproto.HotResult(get.Val(), err == nil); ok {
			return res, nil
		}
		s.hot.Forget(key)
	}
	c.val = redisproto.AppendProcessing(c.buf[:0], s.now(), fingerprint, owner)
	c.args[0], c.args[1], c.args[2], c.args[3], c.args[4], c.args[5], c.args[6] = "set", c.key, &c.val, "nx", "px", &c.n, "get"
	cmd := redis.NewStringCmd(ctx, c.args[:7]...)
	cmd.SetFirstKeyPos(1)
	err := s.rdb.Process(ctx, cmd)
	found := err == nil
	switch {
	case errors.Is(err, redis.Nil):
	case redis.HasErrorPrefix(err, "WRONGTYPE"): // a key of another type: not an entry
		return storage.Result{}, fmt.Errorf("redisstore: %s %q: %w", op, c.key, redisproto.ErrCorrupt)
	case isRedisError(err) && redisproto.SetRefused(err.Error()):
		return storage.Result{}, fmt.Errorf("redisstore: %s: %w", op, redisproto.VersionRefusal(err))
	case err != nil:
		return storage.Result{}, fmt.Errorf("redisstore: %s: %w", op, err)
	}
	res, next, err := redisproto.SetResult(cmd.Val(), found, owner)
	if err != nil {
		return storage.Result{}, fmt.Errorf("redisstore: %s %q: %w", op, c.key, err)
	}
	if !found {
		s.native.Hold(key, owner, c.val, lease) // c is the call's own, never reused
	} else if res.State == storage.Done {
		s.hot.Add(key)
	}
	switch next {
	case redisproto.AskLeaseLeft:
		pttl := redis.NewIntCmd(ctx, "pttl", c.key)
		pttl.SetFirstKeyPos(1)
		if err := s.rdb.Process(ctx, pttl); err != nil {
			return storage.Result{}, fmt.Errorf("redisstore: %s: %w", op, err)
		}
		res.LeaseLeft = redisproto.LeaseLeft(pttl.Val())
	case redisproto.RunAcquire:
		c.stamp = c.val[1:7]
		return s.acquireScript(ctx, op, acquire, redisproto.AcquireResult, c, owner, fingerprint)
	}
	return res, nil
}

// isRedisError reports whether err is an error reply of the server.
func isRedisError(err error) bool {
	var reply redis.Error
	return errors.As(err, &reply) && !errors.Is(err, redis.Nil)
}

// AcquireIssued implements [storage.Issuer.AcquireIssued]. Errors wrap
// [storage.ErrInvalid], [ErrEvictionPolicy] or [ErrRedisVersion], or say
// that Redis could not be reached, failed, or holds a value under the
// key that is not an entry.
func (s *Store) AcquireIssued(ctx context.Context, key, owner, fingerprint string, lease time.Duration) (storage.Result, error) {
	const op = "acquire issued"
	if err := storage.CheckAcquire(key, owner, fingerprint, lease); err != nil {
		return storage.Result{}, fmt.Errorf("redisstore: %s: %w", op, err)
	}
	if err := s.guard.Check(ctx); err != nil {
		return storage.Result{}, fmt.Errorf("redisstore: %s: %w", op, err)
	}
	c := &call{key: s.prefix + key, n: millis{ms: redisproto.Millis(lease)}}
	c.stamped(s.now())
	return s.acquireScript(ctx, op, acquireIssued, redisproto.AcquireIssuedResult, c, owner, fingerprint)
}

// acquireScript runs an acquire script with c's key, lease and stamp.
func (s *Store) acquireScript(ctx context.Context, op string, sc script, result func(redisproto.Reply) (storage.Result, error), c *call, owner, fingerprint string) (storage.Result, error) {
	reply, err := s.run(ctx, sc, c, owner, fingerprint, &c.n, &c.stamp)
	if err != nil {
		return storage.Result{}, fmt.Errorf("redisstore: %s: %w", op, err)
	}
	res, err := result(reply)
	if err != nil {
		return storage.Result{}, fmt.Errorf("redisstore: %s %q: %w", op, c.key, err)
	}
	return res, nil
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
	if err := s.guard.Check(ctx); err != nil {
		return fmt.Errorf("redisstore: issue: %w", err)
	}
	c := &call{key: s.prefix + key, n: millis{ms: redisproto.Millis(ttl)}}
	reply, err := s.run(ctx, issue, c, &c.n, c.stamped(s.now()))
	if err != nil {
		return fmt.Errorf("redisstore: issue: %w", err)
	}
	if err := redisproto.IssueResult(reply); err != nil {
		return fmt.Errorf("redisstore: issue %q: %w", c.key, err)
	}
	return nil
}

// Complete implements [storage.Store.Complete]. The done entry keeps
// owner: a later Complete of it returns nil only for the same owner and
// record (a resend), and ErrNotOwner for any other owner, even with the
// same record, and for a done entry of an older release, which does not
// keep its owner (see the package doc's Layout). It is never refused for
// the server's maxmemory-policy (see [New]). A record longer than
// [WithMaxRecordBytes] allows is [storage.ErrTooLarge], and changes
// nothing. Errors wrap [storage.ErrNotOwner], [storage.ErrTooLarge],
// [storage.ErrInvalid] or (with [WithDurability], the record written)
// [storage.ErrNotDurable], or say that Redis could
// not be reached, failed, or holds a value under the key that is not an
// entry.
func (s *Store) Complete(ctx context.Context, key, owner string, rec []byte, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("redisstore: complete: %w: ttl %v", storage.ErrInvalid, ttl)
	}
	if err := redisproto.RecordTooLarge("redisstore", len(rec), s.maxRecord); err != nil {
		return err
	}
	c := &call{key: s.prefix + key, rec: rec, n: millis{ms: redisproto.Millis(ttl)}}
	if !s.durable.On() {
		return s.complete(ctx, c, key, owner, rec)
	}
	conn, err := s.connFor(ctx, c.key)
	if err != nil {
		return fmt.Errorf("redisstore: complete: %w", err)
	}
	defer conn.Close()
	c.conn = conn
	if err := s.complete(ctx, c, key, owner, rec); err != nil {
		return err
	}
	wait := s.durable.Command()
	cmd := redis.NewCmd(ctx, anys(wait)...)
	err = conn.Process(ctx, cmd)
	if err := s.durable.Check(redisproto.FromAny(cmd.Val()), err); err != nil {
		return fmt.Errorf("redisstore: complete %q: %w", c.key, err)
	}
	return nil
}

// complete writes the done entry of Complete.
func (s *Store) complete(ctx context.Context, c *call, key, owner string, rec []byte) error {
	now := s.now()
	// A record longer than maxPooled goes to the script, which sends it
	// as it is: the native path would copy it into the done entry, and
	// the script's fixed cost is small beside moving such a record.
	if held := s.native.Held(key, owner); held != nil && len(rec) <= maxPooled-len(held)-16 {
		c.val = held
		buf := doneBufs.Get().(*[]byte)
		c.rec = redisproto.AppendDone((*buf)[:0], now, held, owner, rec)
		done, err := s.setIfEq(ctx, "complete", c)
		*buf = c.rec // go-redis wrote it before Process returned
		doneBufs.Put(buf)
		if done || err != nil {
			if done {
				s.native.Drop(key, owner)
			}
			return err
		}
		c.rec = rec
	}
	c.stamped(now)
	c.olen = redisproto.AppendUvarint(c.stamp[len(c.stamp):], uint64(len(owner)))
	return s.dropped(key, owner, s.owned(ctx, "complete", complete, c, owner, &c.rec, &c.n, &c.stamp, &c.olen))
}

// Release implements [storage.Store.Release]: an entry taken from an issue
// goes back to the issued state, for the issue's whole TTL again; Release
// of an issued entry changes nothing and returns nil. It is never refused
// for the server's maxmemory-policy (see [New]). Errors wrap
// [storage.ErrNotOwner], or say that Redis could not be reached, failed,
// or holds a value under the key that is not an entry.
func (s *Store) Release(ctx context.Context, key, owner string) error {
	c := &call{key: s.prefix + key}
	return s.dropped(key, owner, s.owned(ctx, "release", release, c, owner, c.stamped(s.now())))
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
	c := &call{key: s.prefix + key, n: millis{ms: redisproto.Millis(lease)}}
	if held := s.native.Held(key, owner); held != nil {
		c.val, c.rec = held, held
		if done, err := s.setIfEq(ctx, "extend", c); done || err != nil {
			if done {
				s.native.Renewed(key, owner, lease)
			}
			return err
		}
	}
	return s.dropped(key, owner, s.owned(ctx, "extend", extend, c, owner, &c.n))
}

// doneBufs are the buffers of the done entries that Complete's native
// path writes (a *[]byte each), so that a first execution allocates no
// more on the native path than on the script's, which sends the record
// as it is. None is longer than maxPooled.
var doneBufs = sync.Pool{New: func() any { return new([]byte) }}

// maxPooled bounds the done entries that Complete's native path writes.
const maxPooled = 64 << 10

// connFor returns a connection of the client to the server that holds
// key (its master, on a cluster), for a durable Complete: WAIT counts
// the writes of its own connection.
func (s *Store) connFor(ctx context.Context, key string) (*redis.Conn, error) {
	switch rdb := s.rdb.(type) {
	case *redis.Client:
		return rdb.Conn(), nil
	case *redis.ClusterClient:
		node, err := rdb.MasterForKey(ctx, key)
		if err != nil {
			return nil, err
		}
		return node.Conn(), nil
	}
	return nil, fmt.Errorf("%w: WithDurability needs a *redis.Client (NewClient, NewFailoverClient) or a *redis.ClusterClient, not %T", storage.ErrInvalid, s.rdb)
}

// anys returns args as go-redis's commands take them.
func anys(args []string) []any {
	out := make([]any, len(args))
	for i, a := range args {
		out[i] = a
	}
	return out
}

// setIfEq sends the native path's command (see the redisproto package
// doc): SET key c.rec IFEQ c.val PX c.n. It reports whether the server
// wrote the value; done false with a nil error (the entry is not c.val,
// or the server refused the command, having written nothing) leaves the
// answer to the script. The error is one that stood in for the server's
// answer (a network error, a timeout): whether the command ran is then
// unknown, and the caller's retry finds out.
func (s *Store) setIfEq(ctx context.Context, op string, c *call) (done bool, err error) {
	c.args[0], c.args[1], c.args[2], c.args[3], c.args[4], c.args[5], c.args[6] = "set", c.key, &c.rec, "ifeq", &c.val, "px", &c.n
	cmd := redis.NewStatusCmd(ctx, c.args[:7]...)
	cmd.SetFirstKeyPos(1)
	err = s.via(c).Process(ctx, cmd)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, redis.Nil):
	case isRedisError(err):
		s.native.Refused(err.Error())
	default:
		return false, fmt.Errorf("redisstore: %s: %w", op, err)
	}
	return false, nil
}

// dropped forgets the entry held for key and owner once err, the answer
// of an owner-checked script, says it is no longer held as written (nil,
// ErrNotOwner), and returns err. After Extend's script, a nil answer
// means that the native command found another value: what was held is
// stale.
func (s *Store) dropped(key, owner string, err error) error {
	if err == nil || errors.Is(err, storage.ErrNotOwner) {
		s.native.Drop(key, owner)
	}
	return err
}

// owned runs an owner-checked script and maps its answer. It does not
// check the maxmemory-policy: Complete, Release and Extend finish work
// that has started, and always send their script (see [New]).
func (s *Store) owned(ctx context.Context, op string, sc script, c *call, args ...any) error {
	reply, err := s.run(ctx, sc, c, args...)
	if err != nil {
		return fmt.Errorf("redisstore: %s: %w", op, err)
	}
	if err := redisproto.OwnedResult(reply); err != nil {
		return fmt.Errorf("redisstore: %s %q: %w", op, c.key, err)
	}
	return nil
}
