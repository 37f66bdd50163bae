package redisproto

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// ErrEvictionPolicy means that the Redis server (on a cluster or a ring:
// one of its masters or shards) reports a maxmemory-policy other than
// noeviction, under which it may evict the store's keys. The store
// packages export it under their own names; it is one value, so that
// errors.Is matches it whichever store wrapped it.
var ErrEvictionPolicy = errors.New("idem: Redis maxmemory-policy may evict idempotency keys")

// ErrRedisVersion means that the Redis server (on a cluster: one of its
// nodes) is older than [MinVersion]: an Acquire is one SET key value NX
// PX ms GET, which Redis 6.2 refuses (NX with GET came in 7.0). Every
// operation of a store that starts new work then fails with an error
// that wraps it and names the version, and changes nothing; the store
// packages export it under their own names, one value for both.
var ErrRedisVersion = errors.New("idem: the Redis server is older than 7.0")

// MinVersion is the oldest Redis the stores work with.
const MinVersion = "7.0"

// CheckEvery is how long a verdict on the maxmemory-policy stands before
// the next operation starts a check in the background.
const CheckEvery = time.Minute

// CheckTimeout bounds one check, on top of the client's own timeouts: a
// check outlives the request that started it.
const CheckTimeout = 5 * time.Second

// Guard refuses to start new work on a server that may evict, or that is
// older than [MinVersion]. The store
// calls [Guard.Check] before each operation that starts new work
// (Acquire, AcquireIssued, Issue), and never before one that finishes
// work (Complete, Release, Extend). Set its fields before first use; the
// zero Guard with Ask set checks every [CheckEvery] by [time.Now].
type Guard struct {
	// Ask asks every server behind the client for its policy and returns
	// the verdict, nil when the check allows and an error wrapping
	// [ErrEvictionPolicy] when it refuses (see [Tally]); ok is false when
	// the check could not be made, which gives no verdict. It runs on a
	// goroutine of its own, with a context bounded by [CheckTimeout] that
	// keeps the values of the operation's.
	Ask func(ctx context.Context) (refusal error, ok bool)
	// Off turns the check off (the store's WithEvictionAllowed).
	Off bool
	// Every is how long a verdict stands; [CheckEvery] when 0.
	Every time.Duration
	// Now reads the clock; [time.Now] when nil.
	Now func() time.Time

	verdict atomic.Pointer[verdict] // the last verdict; nil before the first

	mu      sync.Mutex
	running chan struct{} // closed when the check in flight ends; nil when none
}

// verdict is the outcome of a check of the maxmemory-policy.
type verdict struct {
	err error     // nil: operations may go on; else it wraps ErrEvictionPolicy
	at  time.Time // when it was reached (by Guard.now)
}

func (g *Guard) now() time.Time {
	if g.Now != nil {
		return g.Now()
	}
	return time.Now()
}

func (g *Guard) every() time.Duration {
	if g.Every > 0 {
		return g.Every
	}
	return CheckEvery
}

// Check returns the error every operation that starts new work fails with
// while the last verdict says the server may evict, and nil otherwise. It
// costs no round trip while the verdict is fresh (younger than Every).
// With a stale verdict it starts a check in the background, unless one is
// in flight, and answers with the stale verdict at once. With no verdict
// at all (the first use, or every check so far failed) it starts a check,
// unless one is in flight, and waits for it, or for ctx to end, whose
// error it then returns. A check that failed gives no verdict, and the
// operation goes on.
func (g *Guard) Check(ctx context.Context) error {
	if g.Off {
		return nil
	}
	v := g.verdict.Load()
	if v != nil && g.now().Sub(v.at) < g.every() {
		return v.err
	}
	done := g.start(ctx)
	if v != nil {
		return v.err
	}
	select {
	case <-done:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	if v := g.verdict.Load(); v != nil {
		return v.err
	}
	return nil
}

// Running returns the channel closed when the check in flight ends, or
// nil when none is. For tests.
func (g *Guard) Running() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.running
}

// closed is a channel that is closed: no check needed.
var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// start returns a channel closed when the check in flight ends, starting
// one if none is in flight and the verdict is not fresh. At most one
// check runs at a time. The check runs on a goroutine of its own, which
// ends when the check does (it is bounded by CheckTimeout and the
// client's timeouts), so that a request waiting for it can give up at its
// deadline, and one that does not wait is not slowed down.
func (g *Guard) start(ctx context.Context) <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.running != nil {
		return g.running
	}
	if v := g.verdict.Load(); v != nil && g.now().Sub(v.at) < g.every() {
		return closed // another check ended since the caller looked
	}
	done := make(chan struct{})
	g.running = done
	// The check keeps ctx's values (for tracing hooks), not its deadline
	// or cancellation: it serves later operations too.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), CheckTimeout)
	go func() {
		defer close(done)
		defer cancel()
		refusal, ok := g.Ask(ctx)
		g.mu.Lock()
		defer g.mu.Unlock()
		if ok {
			g.verdict.Store(&verdict{err: refusal, at: g.now()})
		}
		g.running = nil
	}()
	return done
}

// Tally gathers the answers of the servers a check asks (each master of
// a cluster, each shard of a ring, or the one server) into a verdict. It
// is safe for concurrent use. Pkg names the store package in the advice
// of a refusal ("redisstore").
type Tally struct {
	Pkg string

	mu      sync.Mutex
	asked   int
	evicts  error
	old     error
	unknown error
}

// Version records one server's redis_version ("" when it does not tell,
// as miniredis, or a server whose INFO is refused, does not): one older
// than [MinVersion] refuses, whatever the others answer. node names it as
// in [Tally.Add]. A version that does not read as major.minor is taken
// for a server that does not tell.
func (t *Tally) Version(version, node string) {
	if !olderThan7(version) {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.old == nil {
		t.old = &versionError{version: version, node: node}
	}
}

// olderThan7 reports whether version, as INFO's redis_version gives it
// ("6.2.14"), is older than 7.0; false when it does not read as a
// version.
func olderThan7(version string) bool {
	major, _, ok := strings.Cut(version, ".")
	if !ok || major == "" || len(major) > 4 {
		return false
	}
	n := 0
	for _, c := range major {
		if c < '0' || c > '9' {
			return false
		}
		n = n*10 + int(c-'0')
	}
	return n < 7
}

// Add records one server's answer: its policy ("" when it does not tell)
// or the error that kept it from answering. node names it in a refusal
// ("master host:port"; "" for the one server).
func (t *Tally) Add(policy, node string, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.asked++
	switch {
	case err != nil:
		t.unknown = err
	case policy != "" && policy != "noeviction" && t.evicts == nil:
		t.evicts = &policyError{policy: policy, node: node, pkg: t.Pkg}
	}
}

// Verdict returns a refusal when any server is older than [MinVersion]
// (wrapping [ErrRedisVersion]) or reports an evicting policy (wrapping
// [ErrEvictionPolicy]), even if others could not be asked; no refusal
// when every one answered without (noeviction, or no policy reported,
// and a version of 7.0 or newer, or none reported); and ok false (no
// verdict) when some could not be asked, or none was, or the servers
// could not be listed (listErr), and none refuses.
func (t *Tally) Verdict(listErr error) (refusal error, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.old != nil:
		return t.old, true
	case t.evicts != nil:
		return t.evicts, true
	case listErr != nil || t.unknown != nil || t.asked == 0:
		return nil, false
	}
	return nil, true
}

// ParsePolicy returns the value of the maxmemory_policy line of an INFO
// answer (INFO memory, or INFO's default sections; also reported on
// managed services where CONFIG GET is disabled), or "" when there is
// none.
func ParsePolicy(info string) string { return infoField(info, "maxmemory_policy:") }

// ParseVersion returns the value of the redis_version line of an INFO
// answer (INFO server, or INFO's default sections), or "" when there is
// none.
func ParseVersion(info string) string { return infoField(info, "redis_version:") }

func infoField(info, prefix string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// SetRefused reports whether an error reply (its text) to an Acquire's
// SET key value NX PX ms GET is the one Redis 6.2 gives it ("ERR syntax
// error": it does not take NX with GET). A store whose check is off
// (WithEvictionAllowed) learns the version that way: it answers
// [VersionRefusal].
func SetRefused(msg string) bool { return syntaxError(msg) }

// syntaxError reports whether msg, an error reply's text, is Redis's
// "ERR syntax error". The "ERR " may be missing: rueidis drops it from
// every error reply (for KVRocks).
func syntaxError(msg string) bool {
	return strings.HasPrefix(strings.TrimPrefix(msg, "ERR "), "syntax error")
}

// VersionRefusal is the error of an Acquire whose SET NX GET the server
// refused as a syntax error (see [SetRefused]); it wraps
// [ErrRedisVersion] and says what the server answered.
func VersionRefusal(reply error) error { return &versionError{reply: reply} }

// Transient reports whether an error reply (its text, as the server sent
// it) is one a server gives only for a while (LOADING, BUSY, TRYAGAIN,
// MASTERDOWN, CLUSTERDOWN): the check could not be made. Any other error
// reply to INFO (NOPERM from an ACL, an unknown or renamed command) means
// that the server does not tell its policy, for good. An "ERR " before
// the code (KVRocks sends one) is skipped.
func Transient(msg string) bool {
	msg = strings.TrimPrefix(msg, "ERR ")
	for _, p := range []string{"LOADING", "BUSY", "TRYAGAIN", "MASTERDOWN", "CLUSTERDOWN"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// policyError is the verdict that refuses: it wraps ErrEvictionPolicy and
// says which policy, on which node, and what to do.
type policyError struct {
	policy string
	node   string // "master host:port" on a cluster, "shard ..." on a ring, "" otherwise
	pkg    string
}

func (e *policyError) Error() string {
	on := ""
	if e.node != "" {
		on = " on " + e.node
	}
	return "Redis maxmemory-policy is " + e.policy + on +
		": it may evict idempotency locks and records; set maxmemory-policy noeviction" +
		" (or give the store a Redis of its own with noeviction) or opt out with " + e.pkg + ".WithEvictionAllowed"
}

func (e *policyError) Is(target error) bool { return target == ErrEvictionPolicy }

// versionError is the verdict that refuses a server older than 7.0: it
// wraps ErrRedisVersion and says which version, on which node.
type versionError struct {
	version string // redis_version, or "" when reply says why
	node    string
	reply   error // the server's answer to SET NX GET, when version is ""
}

func (e *versionError) Error() string {
	msg := "idem's Redis stores need Redis " + MinVersion + " or newer (SET NX GET); "
	if e.version == "" {
		return msg + "the server answered SET NX GET with: " + e.reply.Error()
	}
	msg += "the server is " + e.version
	if e.node != "" {
		msg += " (" + e.node + ")"
	}
	return msg
}

func (e *versionError) Is(target error) bool { return target == ErrRedisVersion }

func (e *versionError) Unwrap() error { return e.reply }
