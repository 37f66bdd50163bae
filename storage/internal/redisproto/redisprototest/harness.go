// Package redisprototest holds the tests of the protocol that idem's Redis
// stores speak (package redisproto): the layout of an entry, byte for
// byte; its TTLs; the scripts' answers over values that are not entries,
// or entries of an older release; and their safety when run twice. Both
// store modules (storage/redisstore and storage/rueidisstore) run them
// through their own client, on miniredis and on a real server, so that
// the two transports are held to the very same protocol.
//
// The package depends on no Redis client: a store's test hands it a
// [Harness], the store under test and a way to send the server a command.
package redisprototest

import (
	"context"
	"crypto/rand"
	"strconv"
	"testing"
	"time"

	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/internal/redisproto"
)

// Store is what a Redis store of the kit implements: the operations of a
// store, the issued keys and the inspection.
type Store interface {
	storage.Issuer
	storage.Inspector
}

// Harness is what the suite needs of the store under test and of the
// server that it uses.
type Harness struct {
	// New returns a store on the server that keeps its entries under
	// prefix; for prefix "", a store with the default prefix ("idem:").
	New func(prefix string) Store

	// NewScripts returns a store like New's that never takes the native
	// path (SET IFEQ, see the redisproto package doc): an instance of a
	// release before it, for the tests of a rolling upgrade. Nil skips
	// them.
	NewScripts func(prefix string) Store

	// Do sends the server one command, args as given (the command's name
	// first), and returns its reply as redisproto reads a script's: an
	// integer, a bulk or status string, an array. A nil reply is the zero
	// Reply (Kind Other), with no error; an error reply is an error.
	Do func(ctx context.Context, args ...string) (redisproto.Reply, error)

	// SetTime sets the server's clock, the one TIME answers (and the
	// scripts stamp entries with); the TTLs do not move. Nil when the
	// clock cannot be set (a real server): the tests that need it are
	// skipped. A harness gives it only on a server of its own, holding
	// nothing but what the test writes.
	SetTime func(time.Time)
}

// test is one test of the suite.
type test struct {
	name string
	// clock: the test needs Harness.SetTime, and a server of its own.
	clock bool
	run   func(t *testing.T, h Harness)
}

// tests are the tests Run runs, in order.
var tests = []test{
	{"KeysPrefixedWithTTL", true, testKeysPrefixedWithTTL},
	{"EveryKeyHasTTL", false, testEveryKeyHasTTL},
	{"CorruptValue", false, testCorruptValue},
	{"OldDoneEntry", false, testOldDoneEntry},
	{"InspectBesideOtherValues", false, testInspectBesideOtherValues},
	{"ScriptsAreSafeToRunTwice", false, testScriptsAreSafeToRunTwice},
	{"CompleteChecksTheOwnerOfADoneEntry", false, testCompleteChecksTheOwnerOfADoneEntry},
	{"NativeSharesEntries", false, testNativeSharesEntries},
	{"NativeCommands", false, testNativeCommands},
	{"RollingUpgradeDuplicates", false, testRollingUpgradeDuplicates},
	{"HotReplays", false, testHotReplays},
}

// Run runs every test of the suite as a subtest of t, each on the
// harness that open returns for it. A test that needs to set the
// server's clock is skipped when the harness cannot (SetTime is nil).
func Run(t *testing.T, open func(t *testing.T) Harness) {
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := open(t)
			if tc.clock && h.SetTime == nil {
				t.Skip("the server's clock cannot be set")
			}
			tc.run(t, h)
		})
	}
}

// prefix returns a prefix no other test uses, for tests on a shared
// server.
func prefix(name string) string { return "test:" + name + ":" + rand.Text()[:8] + ":" }

// do sends a command and fails the test on an error reply.
func do(t testing.TB, h Harness, args ...string) redisproto.Reply {
	t.Helper()
	r, err := h.Do(t.Context(), args...)
	if err != nil {
		t.Fatalf("%q: %v", args, err)
	}
	return r
}

// set stores value under key, for ttl (whole milliseconds).
func set(t testing.TB, h Harness, key, value string, ttl time.Duration) {
	t.Helper()
	do(t, h, "SET", key, value, "PX", strconv.FormatInt(ttl.Milliseconds(), 10))
}

// get returns the string under key, and whether there is one.
func get(t testing.TB, h Harness, key string) (string, bool) {
	t.Helper()
	r := do(t, h, "GET", key)
	return r.Str, r.Kind == redisproto.String
}

// pttl returns the TTL of key, as PTTL answers it: -2ms when there is
// no key, -1ms when it has no TTL.
func pttl(t testing.TB, h Harness, key string) time.Duration {
	t.Helper()
	r := do(t, h, "PTTL", key)
	if r.Kind != redisproto.Int {
		t.Fatalf("PTTL %s answered %+v, want an integer", key, r)
	}
	return time.Duration(r.Int) * time.Millisecond
}

// keys returns the keys that match pattern (KEYS: on a test server, it
// is fine).
func keys(t testing.TB, h Harness, pattern string) []string {
	t.Helper()
	r := do(t, h, "KEYS", pattern)
	if r.Kind != redisproto.Array {
		t.Fatalf("KEYS %s answered %+v, want an array", pattern, r)
	}
	out := make([]string, len(r.Array))
	for i, k := range r.Array {
		out[i] = k.Str
	}
	return out
}

// errString is err's text, "nil" for none.
func errString(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}
