// Package rueidisstore is a [storage.Store] on Redis through the rueidis
// client, shared by every instance of a service:
//
//	client, err := rueidis.NewClient(rueidisstore.ClientOption("localhost:6379"))
//	if err != nil {
//		return err
//	}
//	store := rueidisstore.New(client)
//	m, err := idem.New(store)
//
// It works with whatever rueidis.NewClient returns unchanged: the client
// of one server, of a Redis Cluster, or of the master that Sentinel names.
//
// It speaks exactly the protocol of storage/redisstore, the store on
// go-redis: the same Lua scripts, the same keys under the same prefix,
// the same entries (their layout, and how releases before this one read
// them, is described in redisstore's package documentation), the same
// answers and the same guard against a server that may evict. An entry
// written by one store is read and finished by the other, so a service
// can move from one client to the other, or run both while a deploy rolls
// out, without a request running twice. What rueidis brings is speed: it
// pipelines the commands of concurrent callers into shared writes on a
// few connections (auto-pipelining), where go-redis takes a connection of
// its pool for each command; the store keeps its own work per call small.
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
// run through rueidis's own Lua support (EVALSHA, then EVAL when the
// server does not have the script cached). Every key carries a TTL, sent
// in milliseconds and rounded up (never 0, which PEXPIRE takes as "delete
// now"). Every command gives the same answer when sent twice (an Acquire
// resent after its first made the entry finds the owner's own entry, and
// renews it), except Issue's: run twice, it answers [storage.ErrExists]
// the second time, as the contract asks of an Issue of a key that has an
// entry (the key is issued all the same). So the commands are marked
// retryable: rueidis may resend one after a network error (see
// [ClientOption] for when, and how often).
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
// ran it again. See [New]. A Redis shared with other applications that
// want eviction (a cache) cannot serve the store: the policy and
// maxmemory are the server's, for all its databases, so give the store a
// server of its own. [WithEvictionAllowed] opts out.
//
// # Inspection
//
// The store is a [storage.Inspector]: [Store.Lookup] and [Store.Remove]
// are one script on one key, [Store.List] pages through the keys under the
// prefix with SCAN (on every master of a Cluster), two round trips a page
// (three on a Cluster), safe on a server with millions of keys. Grant the
// client's ACL user +scan and +time for them (and +cluster|slots on a
// Cluster, which rueidis needs anyway).
package rueidisstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/internal/redisproto"
	"github.com/redis/rueidis"
)

// DefaultPrefix is the prefix of every key the store writes unless
// WithPrefix says otherwise. It is redisstore's: both stores find each
// other's entries.
const DefaultPrefix = "idem:"

// Store is a storage.Store on Redis through a rueidis client. Create it
// with [New]; the zero value is not usable. It is safe for concurrent use.
type Store struct {
	c      rueidis.Client
	prefix string
	guard  redisproto.Guard
	now    func() time.Time // the clock that stamps entries
	// maxRecord is the longest record Complete sends (WithMaxRecordBytes).
	maxRecord int
	// native is the native path (SET IFEQ) and the entries it holds.
	native redisproto.Native
	// durable is what Complete waits for (WithDurability).
	durable redisproto.Durability
	// hot is the keys found done lately, which Acquire reads with a GET
	// (through the client-side cache with WithReplayCache).
	hot redisproto.Hot
	// replayMaxAge is WithReplayCache's; 0: off.
	replayMaxAge time.Duration
}

var (
	_ storage.Store  = (*Store)(nil)
	_ storage.Issuer = (*Store)(nil)
)

// Option configures a Store.
type Option func(*Store)

// WithPrefix sets the prefix of every key, [DefaultPrefix] by default. An
// empty prefix is allowed. Give each application sharing a Redis its own
// prefix, and a redisstore.Store that is to share the entries the same
// one. A hash tag such as "{idem}:" would put all keys on one Redis
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
// has the record loses it, so that the retry runs again). The write and
// the wait (WAIT or WAITAOF, one more command, which the answer waits
// for: about a replica's round trip, at most d.Timeout) go on a
// connection dedicated to the call (rueidis's Dedicated, on a cluster the
// key's master's), as WAIT counts its own connection's writes. When the
// wait ends short of d (the timeout passed, or the wait itself failed),
// the record stands, the answer is still sent, and Complete returns an
// error wrapping [storage.ErrNotDurable], which the middleware takes as a
// stored record (it is not retried) and reports in the observer's
// Executed event. A Complete that is a resend (its first's answer was
// lost) writes nothing, and its wait confirms what the replicas hold of
// that connection's writes, not of the first's.
func WithDurability(d Durability) Option { return func(s *Store) { s.durable = d } }

// New returns a Store that keeps its entries in the Redis behind c. It
// sends nothing until used. It does not own c: the caller closes it, after
// the last use of the store.
//
// # Eviction
//
// The store refuses to start new work on a Redis that may evict its keys:
// an evicted in-flight entry lets a duplicate request run the handler
// again. Only the operations that start new work check the policy:
// Acquire, AcquireIssued and Issue ("operation" below means one of
// these). The first one asks every node the client knows (c.Nodes()) for
// its maxmemory-policy and version (INFO default, sent to all of them in parallel: the
// one server; each master and each replica of a Cluster, since a replica
// becomes a master on failover; the master, and the replicas the client
// reads from, of a Sentinel or standalone client) and waits for the
// answers; from then on the verdict stands for about a minute, after
// which the next operation starts a check in the background and goes on
// with the old verdict without waiting. At most one check is in flight;
// no goroutine outlives it. While the verdict says a node may evict, every
// operation fails with an error wrapping [ErrEvictionPolicy] that names
// the policy (and the node, on a Cluster or a client that knows several
// nodes), without
// sending its script. So a policy changed at run time (CONFIG SET) is
// noticed within about a minute, either way.
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
//     answer without the maxmemory_policy field, an INFO refused with
//     NOPERM by an ACL, an unknown or renamed INFO command (miniredis
//     answers INFO default with an error). The verdict allows, and stands
//     like any other. Grant +info to the client's ACL user for the check
//     to work.
//   - A check that could not be made (a network error or a timeout, a
//     transient error reply such as LOADING, a node that does not answer,
//     a client that knows no node) gives no verdict: an older verdict
//     stands, and the next operation starts another check. Before the
//     first verdict, each operation waits for a check (or for its context
//     to end, and then returns the context's error) and, when that check
//     fails, goes on and succeeds or fails on its own; while Redis is
//     unreachable before the first verdict, an operation thus takes up to
//     twice as long to fail.
//
// [WithEvictionAllowed] turns the check off.
//
// Give c the options of [ClientOption], or options as bounded: rueidis's
// defaults suit batch work, not a request path.
func New(c rueidis.Client, opts ...Option) *Store {
	s := &Store{c: c, prefix: DefaultPrefix, now: time.Now, maxRecord: redisproto.DefaultMaxRecord}
	s.guard.Ask = s.askPolicy
	for _, o := range opts {
		if o != nil {
			o(s)
		}
	}
	return s
}

// ClientOption returns the rueidis options recommended for a client that
// serves the middleware on a request path, for the servers at addrs (one
// server, some nodes of a Cluster, or the sentinels once
// Sentinel.MasterSet is set). With them a request gets its 503 at once
// while Redis is down (its connections refused), and within about a
// second while it is stalled or cut off, instead of the ten seconds and
// more of rueidis's defaults, or never (see RetryDelay below). Change any
// field before use:
//
//	opt := rueidisstore.ClientOption("localhost:6379")
//	opt.Password = os.Getenv("REDIS_PASSWORD")
//	client, err := rueidis.NewClient(opt)
//
// The fields it sets, and why:
//
//   - Dialer.Timeout 250 ms (rueidis's default 5 s): a connection, with
//     its HELLO handshake, is made within it or fails. rueidis.NewClient
//     dials at once, unlike go-redis: it fails when no server answers
//     within it, so a program that starts while Redis is down gets an
//     error rather than a client.
//   - Dialer.KeepAlive 250 ms (default 1 s): besides the TCP keep-alive,
//     the interval at which rueidis sends PING on a connection that
//     received nothing since the last one. With ConnWriteTimeout, a server
//     that stops answering (stalled, or cut off without a reset) is given
//     up within 500 to 750 ms, and every command waiting on the connection
//     fails then (a command whose context ends earlier fails at its end).
//     An idle connection costs four PINGs a second.
//   - ConnWriteTimeout 250 ms (default ten times Dialer.KeepAlive): how
//     long that PING, or a write, may wait.
//   - RetryDelay allowing one resend, at once. rueidis resends a
//     retryable command after a network error, and after a LOADING,
//     TRYAGAIN or CLUSTERDOWN answer (never after another error reply),
//     as long as RetryDelay allows; its default allows resends with a
//     backoff of up to a second for as long as the command's context
//     lasts: a request's lasts until its client gives up, so while Redis
//     is down a request would wait instead of getting its 503. Read-only
//     commands are retryable; the store's own commands are not (see
//     Resends in the package documentation), so this bounds the resends
//     of the other commands a program sends on the same client. (DisableRetry
//     turns every resend off.)
//   - DisableCache true: the store does not use client-side caching (its
//     scripts are not cacheable), which would cost a CLIENT TRACKING per
//     connection and the memory of a cache; it also lets the client talk
//     to a server without RESP3. Set it back to false for
//     [WithReplayCache].
//
// Auto-pipelining stays on (DisableAutoPipelining false): concurrent
// operations share the writes of a few connections, which is what the
// store is for. A Cluster's redirections (MOVED, ASK) are followed
// whatever the options: the node did not run the script.
func ClientOption(addrs ...string) rueidis.ClientOption {
	return rueidis.ClientOption{
		InitAddress:      addrs,
		Dialer:           net.Dialer{Timeout: 250 * time.Millisecond, KeepAlive: 250 * time.Millisecond},
		ConnWriteTimeout: 250 * time.Millisecond,
		RetryDelay:       resendOnce,
		DisableCache:     true,
	}
}

// resendOnce is the RetryDelay of [ClientOption]: one resend, at once.
func resendOnce(attempts int, _ rueidis.Completed, _ error) time.Duration {
	if attempts > 1 {
		return -1
	}
	return 0
}

// The protocol's scripts as rueidis runs them. None is retryable: rueidis
// never resends the store's commands (see Resends in the package
// documentation).
var (
	acquire       = rueidis.NewLuaScript(redisproto.Acquire.Src)
	acquireIssued = rueidis.NewLuaScript(redisproto.AcquireIssued.Src)
	issue         = rueidis.NewLuaScript(redisproto.Issue.Src)
	complete      = rueidis.NewLuaScript(redisproto.Complete.Src)
	release       = rueidis.NewLuaScript(redisproto.Release.Src)
	extend        = rueidis.NewLuaScript(redisproto.Extend.Src)
	inspect       = rueidis.NewLuaScript(redisproto.Inspect.Src)
	remove        = inspect
)

// call is the arguments of one script call: the Redis key (KEYS[1]), then
// ARGV. Those the store makes (the prefixed key, a lease or TTL in
// decimal, the copy of a record) are strings over buf, and calls come
// from a pool, so that a call allocates nothing once the pool is warm. A
// call goes back to the pool once the server has answered it (rueidis has
// written the command and is done with it), and only then: a command
// whose context ends before rueidis has written it stays queued, and is
// written later, so its arguments must not change until then; such a call
// is left to the garbage collector. (That is also why a record is copied:
// the caller of Complete reuses its memory once Complete returns, and the
// middleware hands it to the next request.)
type call struct {
	buf      []byte
	args     [6]string
	n        int  // arguments set
	answered bool // by the server: the call may go back to the pool
}

// maxPooled bounds the buffer of a call that goes back to callPool.
const maxPooled = 64 << 10

// room is the room a call needs for a lease or TTL in decimal.
const room = 20

var callPool = sync.Pool{New: func() any { return new(call) }}

// newCall starts the call on the Redis key prefix+key, with room for
// extra bytes of arguments to make.
func newCall(prefix, key string, extra int) *call {
	c := callPool.Get().(*call)
	c.buf = slices.Grow(c.buf[:0], len(prefix)+len(key)+extra)
	c.buf = append(append(c.buf, prefix...), key...)
	c.args[0], c.n = rueidis.BinaryString(c.buf), 1
	return c
}

// key returns the Redis key.
func (c *call) key() string { return c.args[0] }

// arg adds an argument given by the caller.
func (c *call) arg(a string) {
	c.args[c.n] = a
	c.n++
}

// bytes adds a copy of b.
func (c *call) bytes(b []byte) {
	i := len(c.buf)
	c.buf = append(c.buf, b...)
	c.arg(rueidis.BinaryString(c.buf[i:]))
}

// stamp adds the stamp of now (see [redisproto.AppendStamp]).
func (c *call) stamp(now time.Time) {
	i := len(c.buf)
	c.buf = redisproto.AppendStamp(c.buf, now)
	c.arg(rueidis.BinaryString(c.buf[i:]))
}

// uvarint adds x as an unsigned varint.
func (c *call) uvarint(x uint64) {
	i := len(c.buf)
	c.buf = redisproto.AppendUvarint(c.buf, x)
	c.arg(rueidis.BinaryString(c.buf[i:]))
}

// millis adds d in whole milliseconds, rounded up (see [redisproto.Millis]).
func (c *call) millis(d time.Duration) {
	i := len(c.buf)
	c.buf = strconv.AppendInt(c.buf, redisproto.Millis(d), 10)
	c.arg(rueidis.BinaryString(c.buf[i:]))
}

// run runs sc with the call's arguments through client and converts the
// answer, or returns the error that stood in for it. A nil reply, which
// the scripts never give, is an unexpected reply: it must not pass for
// "no entry".
func (c *call) run(ctx context.Context, client rueidis.Client, sc *rueidis.Lua) (redisproto.Reply, error) {
	r := sc.Exec(ctx, client, c.args[:1], c.args[1:c.n])
	c.answered = r.NonRedisError() == nil
	return replyOf(r)
}

// runOn runs p with the call's arguments on cc, a connection dedicated to
// the call, as rueidis's Lua.Exec does on a client: EVALSHA, then EVAL
// when the server does not have the script cached.
func (c *call) runOn(ctx context.Context, cc rueidis.CoreClient, p redisproto.Script) (redisproto.Reply, error) {
	r := cc.Do(ctx, cc.B().Evalsha().Sha1(p.SHA).Numkeys(1).Key(c.args[0]).Arg(c.args[1:c.n]...).Build())
	if e, ok := rueidis.IsRedisErr(r.Error()); ok && e.IsNoScript() {
		r = cc.Do(ctx, cc.B().Eval().Script(p.Src).Numkeys(1).Key(c.args[0]).Arg(c.args[1:c.n]...).Build())
	}
	c.answered = r.NonRedisError() == nil
	return replyOf(r)
}

// free ends the use of the call: back to the pool if the server answered
// it.
func (c *call) free() {
	if !c.answered || cap(c.buf) > maxPooled {
		return
	}
	c.args, c.n, c.answered = [6]string{}, 0, false
	callPool.Put(c)
}

// replyOf converts a script's answer, or returns the error that stood in
// for it (a network error, an error reply).
func replyOf(r rueidis.RedisResult) (redisproto.Reply, error) {
	m, err := r.ToMessage()
	if rueidis.IsRedisNil(err) {
		return redisproto.Reply{}, redisproto.Unexpected(redisproto.Reply{})
	}
	if err != nil {
		return redisproto.Reply{}, err
	}
	return convert(&m), nil
}

// convert converts a reply: an integer, a string (shared with m, not
// copied) or an array; anything else is Other.
func convert(m *rueidis.RedisMessage) redisproto.Reply {
	switch {
	case m.IsInt64():
		n, _ := m.ToInt64()
		return redisproto.Reply{Kind: redisproto.Int, Int: n}
	case m.IsString():
		str, _ := m.ToString()
		return redisproto.Reply{Kind: redisproto.String, Str: str}
	case m.IsArray():
		v, _ := m.ToArray()
		a := make([]redisproto.Reply, len(v))
		for i := range v {
			a[i] = convert(&v[i])
		}
		return redisproto.Reply{Kind: redisproto.Array, Array: a}
	}
	return redisproto.Reply{}
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
// lately (the last 4,096) is read with a GET first (through the
// client-side cache with [WithReplayCache]), which answers its replays
// at the cost of a GET (see redisproto.Hot); a GET that finds it no
// longer done costs that one more command. Another owner's processing entry
// costs a PTTL more, for its lease left; an issued entry, or the
// owner's own processing entry (a resent Acquire, whose lease is
// renewed), the Acquire script more. The SET is marked retryable (see
// [ClientOption]): resent after its first run made the entry, it finds
// the owner's own entry, and renews it.
func (s *Store) Acquire(ctx context.Context, key, owner, fingerprint string, lease time.Duration) (storage.Result, error) {
	const op = "acquire"
	if err := storage.CheckAcquire(key, owner, fingerprint, lease); err != nil {
		return storage.Result{}, fmt.Errorf("rueidisstore: %s: %w", op, err)
	}
	if err := s.guard.Check(ctx); err != nil {
		return storage.Result{}, fmt.Errorf("rueidisstore: %s: %w", op, err)
	}
	if s.hot.Has(key) {
		if res, ok := s.hotReplay(ctx, key); ok {
			return res, nil
		}
	}
	c := newCall(s.prefix, key, 9+len(fingerprint)+len(owner)+room+6)
	defer c.free()
	i := len(c.buf)
	c.buf = redisproto.AppendProcessing(c.buf, s.now(), fingerprint, owner)
	value := rueidis.BinaryString(c.buf[i:])
	r := s.c.Do(ctx, s.c.B().Set().Key(c.key()).Value(value).Nx().Get().PxMilliseconds(redisproto.Millis(lease)).Build())
	c.answered = r.NonRedisError() == nil
	v, err := r.ToString()
	found := err == nil
	if err != nil && !rueidis.IsRedisNil(err) {
		if reply, ok := rueidis.IsRedisErr(err); ok {
			switch {
			case strings.HasPrefix(reply.Error(), "WRONGTYPE"): // a key of another type: not an entry
				return storage.Result{}, fmt.Errorf("rueidisstore: %s %q: %w", op, c.key(), redisproto.ErrCorrupt)
			case redisproto.SetRefused(reply.Error()):
				return storage.Result{}, fmt.Errorf("rueidisstore: %s: %w", op, redisproto.VersionRefusal(err))
			}
		}
		return storage.Result{}, fmt.Errorf("rueidisstore: %s: %w", op, err)
	}
	res, next, err := redisproto.SetResult(v, found, owner)
	if err != nil {
		return storage.Result{}, fmt.Errorf("rueidisstore: %s %q: %w", op, c.key(), err)
	}
	if !found {
		s.native.Hold(key, owner, bytes.Clone(c.buf[i:]), lease) // c.buf goes back to the pool
	} else if res.State == storage.Done {
		s.hot.Add(key)
	}
	switch next {
	case redisproto.AskLeaseLeft:
		pttl, err := s.c.Do(ctx, s.c.B().Pttl().Key(c.key()).Build()).AsInt64()
		if err != nil {
			return storage.Result{}, fmt.Errorf("rueidisstore: %s: %w", op, err)
		}
		res.LeaseLeft = redisproto.LeaseLeft(pttl)
	case redisproto.RunAcquire:
		c.arg(owner)
		c.arg(fingerprint)
		c.millis(lease)
		c.arg(value[1:7]) // the stamp
		return s.acquireScript(ctx, op, acquire, redisproto.AcquireResult, c)
	}
	return res, nil
}

// AcquireIssued implements [storage.Issuer.AcquireIssued]. Errors wrap
// [storage.ErrInvalid], [ErrEvictionPolicy] or [ErrRedisVersion], or say
// that Redis could not be reached, failed, or holds a value under the
// key that is not an entry.
func (s *Store) AcquireIssued(ctx context.Context, key, owner, fingerprint string, lease time.Duration) (storage.Result, error) {
	const op = "acquire issued"
	if err := storage.CheckAcquire(key, owner, fingerprint, lease); err != nil {
		return storage.Result{}, fmt.Errorf("rueidisstore: %s: %w", op, err)
	}
	if err := s.guard.Check(ctx); err != nil {
		return storage.Result{}, fmt.Errorf("rueidisstore: %s: %w", op, err)
	}
	c := newCall(s.prefix, key, room+6)
	defer c.free()
	c.arg(owner)
	c.arg(fingerprint)
	c.millis(lease)
	c.stamp(s.now())
	return s.acquireScript(ctx, op, acquireIssued, redisproto.AcquireIssuedResult, c)
}

// acquireScript runs an acquire script with c's arguments.
func (s *Store) acquireScript(ctx context.Context, op string, sc *rueidis.Lua, result func(redisproto.Reply) (storage.Result, error), c *call) (storage.Result, error) {
	reply, err := c.run(ctx, s.c, sc)
	if err != nil {
		return storage.Result{}, fmt.Errorf("rueidisstore: %s: %w", op, err)
	}
	res, err := result(reply)
	if err != nil {
		return storage.Result{}, fmt.Errorf("rueidisstore: %s %q: %w", op, c.key(), err)
	}
	return res, nil
}

// Issue implements [storage.Issuer.Issue]. Errors wrap [storage.ErrExists],
// [storage.ErrInvalid] or [ErrEvictionPolicy], or say that Redis could not
// be reached, failed, or holds a value under the key that is not an entry.
// A command that rueidis resent after a network error, once the first had
// issued the key, answers ErrExists.
func (s *Store) Issue(ctx context.Context, key string, ttl time.Duration) error {
	switch {
	case key == "":
		return fmt.Errorf("rueidisstore: issue: %w: empty key", storage.ErrInvalid)
	case ttl <= 0:
		return fmt.Errorf("rueidisstore: issue: %w: ttl %v", storage.ErrInvalid, ttl)
	}
	if err := s.guard.Check(ctx); err != nil {
		return fmt.Errorf("rueidisstore: issue: %w", err)
	}
	c := newCall(s.prefix, key, room+6)
	defer c.free()
	c.millis(ttl)
	c.stamp(s.now())
	reply, err := c.run(ctx, s.c, issue)
	if err != nil {
		return fmt.Errorf("rueidisstore: issue: %w", err)
	}
	if err := redisproto.IssueResult(reply); err != nil {
		return fmt.Errorf("rueidisstore: issue %q: %w", c.key(), err)
	}
	return nil
}

// Complete implements [storage.Store.Complete]. The done entry keeps
// owner: a later Complete of it returns nil only for the same owner and
// record (a resend), and ErrNotOwner for any other owner, even with the
// same record, and for a done entry of an older release, which does not
// keep its owner. It is never refused for the server's maxmemory-policy
// (see [New]). A record longer than [WithMaxRecordBytes]
// allows is [storage.ErrTooLarge], and changes nothing. Errors wrap
// [storage.ErrNotOwner], [storage.ErrTooLarge], [storage.ErrInvalid] or
// (with [WithDurability], the record written) [storage.ErrNotDurable],
// or say that Redis could not be reached, failed, or holds a value under
// the key that is not an entry.
//
// It sends a copy of rec, not rec itself: a command whose context ends
// before rueidis has written it stays queued, and is written later, after
// Complete has returned and the caller has reused rec's memory (the
// middleware hands it to the next request).
func (s *Store) Complete(ctx context.Context, key, owner string, rec []byte, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("rueidisstore: complete: %w: ttl %v", storage.ErrInvalid, ttl)
	}
	if err := redisproto.RecordTooLarge("rueidisstore", len(rec), s.maxRecord); err != nil {
		return err
	}
	if !s.durable.On() {
		return s.complete(ctx, s.c, key, owner, rec, ttl)
	}
	// WAIT and WAITAOF count the writes of their own connection: the
	// write and the wait go on one, dedicated to the call (on a cluster,
	// to the key's master).
	return s.c.Dedicated(func(d rueidis.DedicatedClient) error {
		if err := s.complete(ctx, d, key, owner, rec, ttl); err != nil {
			return err
		}
		m, err := d.Do(ctx, d.B().Arbitrary(s.durable.Command()...).Build()).ToMessage()
		if err := s.durable.Check(convert(&m), err); err != nil {
			return fmt.Errorf("rueidisstore: complete %q: %w", s.prefix+key, err)
		}
		return nil
	})
}

// complete writes the done entry of Complete through cc: the client, or
// a connection dedicated to a durable Complete.
func (s *Store) complete(ctx context.Context, cc rueidis.CoreClient, key, owner string, rec []byte, ttl time.Duration) error {
	now := s.now()
	held := s.native.Held(key, owner)
	c := newCall(s.prefix, key, len(rec)+room+6+5+len(held)+len(owner)+8)
	defer c.free()
	if held != nil {
		i := len(c.buf)
		c.buf = redisproto.AppendDone(c.buf, now, held, owner, rec)
		if done, err := s.setIfEq(ctx, cc, "complete", c, rueidis.BinaryString(c.buf[i:]), held, ttl); done || err != nil {
			if done {
				s.native.Drop(key, owner)
			}
			return err
		}
	}
	c.arg(owner)
	c.bytes(rec)
	c.millis(ttl)
	c.stamp(now)
	c.uvarint(uint64(len(owner)))
	return s.dropped(key, owner, s.ownedOn(ctx, cc, "complete", complete, redisproto.Complete, c))
}

// Release implements [storage.Store.Release]: an entry taken from an issue
// goes back to the issued state, for the issue's whole TTL again; Release
// of an issued entry changes nothing and returns nil. It is never refused
// for the server's maxmemory-policy (see [New]). Errors wrap
// [storage.ErrNotOwner], or say that Redis could not be reached, failed,
// or holds a value under the key that is not an entry.
func (s *Store) Release(ctx context.Context, key, owner string) error {
	c := newCall(s.prefix, key, 6)
	defer c.free()
	c.arg(owner)
	c.stamp(s.now())
	return s.dropped(key, owner, s.owned(ctx, "release", release, c))
}

// Extend implements [storage.Store.Extend]. It is never refused for the
// server's maxmemory-policy (see [New]). Errors wrap
// [storage.ErrNotOwner] or [storage.ErrInvalid], or say that Redis could
// not be reached, failed, or holds a value under the key that is not an
// entry.
func (s *Store) Extend(ctx context.Context, key, owner string, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("rueidisstore: extend: %w: lease %v", storage.ErrInvalid, lease)
	}
	c := newCall(s.prefix, key, room)
	defer c.free()
	if held := s.native.Held(key, owner); held != nil {
		v := rueidis.BinaryString(held)
		if done, err := s.setIfEq(ctx, s.c, "extend", c, v, held, lease); done || err != nil {
			if done {
				s.native.Renewed(key, owner, lease)
			}
			return err
		}
	}
	c.arg(owner)
	c.millis(lease)
	return s.dropped(key, owner, s.owned(ctx, "extend", extend, c))
}

// setIfEq sends the native path's command (see the redisproto package
// doc): SET key value IFEQ held PX d. It reports whether the server wrote
// the value; done false with a nil error (the entry is not held, or the
// server refused the command, having written nothing) leaves the answer
// to the script. The error is one that stood in for the server's answer
// (a network error, a timeout): whether the command ran is then unknown,
// and the caller's retry finds out.
func (s *Store) setIfEq(ctx context.Context, cc rueidis.CoreClient, op string, c *call, value string, held []byte, d time.Duration) (done bool, err error) {
	r := cc.Do(ctx, cc.B().Set().Key(c.key()).Value(value).Ifeq(rueidis.BinaryString(held)).PxMilliseconds(redisproto.Millis(d)).Build())
	c.answered = r.NonRedisError() == nil
	err = r.Error()
	if err == nil {
		return true, nil
	}
	if rueidis.IsRedisNil(err) {
		return false, nil
	}
	if reply, ok := rueidis.IsRedisErr(err); ok {
		s.native.Refused(reply.Error())
		return false, nil
	}
	return false, fmt.Errorf("rueidisstore: %s: %w", op, err)
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
func (s *Store) owned(ctx context.Context, op string, sc *rueidis.Lua, c *call) error {
	return s.ownedOn(ctx, s.c, op, sc, redisproto.Script{}, c)
}

// ownedOn is owned through cc: the client, which runs sc; or a
// connection dedicated to the call, which runs p by EVALSHA, then EVAL
// when the server does not have it cached (the script sc runs).
func (s *Store) ownedOn(ctx context.Context, cc rueidis.CoreClient, op string, sc *rueidis.Lua, p redisproto.Script, c *call) error {
	var reply redisproto.Reply
	var err error
	if client, ok := cc.(rueidis.Client); ok {
		reply, err = c.run(ctx, client, sc)
	} else {
		reply, err = c.runOn(ctx, cc, p)
	}
	if err != nil {
		return fmt.Errorf("rueidisstore: %s: %w", op, err)
	}
	if err := redisproto.OwnedResult(reply); err != nil {
		return fmt.Errorf("rueidisstore: %s %q: %w", op, c.key(), err)
	}
	return nil
}
