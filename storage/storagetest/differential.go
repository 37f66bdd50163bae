package storagetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/storage"
)

// DiffHarness is what [Differential] compares: a store under test and a
// reference store, each on a clock that Advance moves.
type DiffHarness struct {
	// Reference is the store whose answers are right: the memory store on
	// an injected clock.
	Reference storage.Issuer
	// Store is the store under test, empty when Differential starts.
	Store storage.Issuer
	// Advance moves both stores' clocks forward by d.
	Advance func(d time.Duration)
}

// DiffSeeds are inputs of [Differential] that reach its interesting paths
// at once; a fuzz target adds them to its corpus:
//
//   - Acquire a/o1 for 10ms, a step of 11ms, Acquire a/o2: the lease ran
//     out.
//   - Acquire, Complete with a 15ms TTL, Acquire by another owner: done.
//   - Issue a for 10ms, AcquireIssued by o1 for 10ms, Release (issued
//     again, for 10ms), a step of 11ms, AcquireIssued by o2: not issued.
var DiffSeeds = [][]byte{
	{0, 161, 19, 44, 15, 161},
	{0, 161, 1, 241, 15, 161},
	{180, 160, 181, 161, 2, 0, 4, 44, 187, 162},
}

// Differential decodes data into a sequence of at most 64 operations and
// clock steps over a few keys, owners, fingerprints and records (so that
// random sequences collide often, and reach the ErrInvalid paths), applies
// each to both stores of h, and fails t at the first step where they
// answer differently: the error's kind (nil, ErrNotOwner, ErrInvalid,
// ErrFull, ErrExists or another), the state, fingerprint and record, and
// the lease left. Only the lease left may differ, by at most a
// millisecond, and only after a clock step that was not a whole number of
// milliseconds (which a real Redis, on a millisecond clock, never sees;
// miniredis's PTTL truncates 2.7ms to 2ms, the memory store rounds it up
// to 3ms). The failure lists the whole run. Call it from a fuzz target:
//
//	func FuzzDifferential(f *testing.F) {
//		for _, seed := range storagetest.DiffSeeds {
//			f.Add(seed)
//		}
//		f.Fuzz(func(t *testing.T, data []byte) {
//			storagetest.Differential(t, data, newDiffHarness(t))
//		})
//	}
func Differential(t *testing.T, data []byte, h DiffHarness) {
	t.Helper()
	ops := decodeDiffOps(data)
	stores := [2]storage.Issuer{h.Reference, h.Store}
	ctx := context.Background()
	fraction := false // a clock step with a fraction of a millisecond happened
	for i, o := range ops {
		if o.kind == 4 {
			h.Advance(o.d)
			fraction = fraction || o.d%time.Millisecond != 0
			continue
		}
		var res [2]storage.Result
		var errs [2]error
		for j, s := range stores {
			switch o.kind {
			case 0:
				res[j], errs[j] = s.Acquire(ctx, o.key, o.owner, o.fp, o.d)
			case 1:
				errs[j] = s.Complete(ctx, o.key, o.owner, bytes.Clone(o.record), o.d)
			case 2:
				errs[j] = s.Release(ctx, o.key, o.owner)
			case 3:
				errs[j] = s.Extend(ctx, o.key, o.owner, o.d)
			case 5:
				errs[j] = s.Issue(ctx, o.key, o.d)
			case 6:
				res[j], errs[j] = s.AcquireIssued(ctx, o.key, o.owner, o.fp, o.d)
			}
		}
		fail := func(what string, m, r any) {
			t.Helper()
			var b strings.Builder
			for k, p := range ops[:i+1] {
				fmt.Fprintf(&b, "\n  %2d %v", k, p)
			}
			t.Fatalf("op %d %v: %s differ: reference %v, store %v; the run:%s", i, o, what, m, r, b.String())
		}
		if m, r := errClass(errs[0]), errClass(errs[1]); m != r {
			fail("errors", m, r)
		}
		m, r := res[0], res[1]
		if m.State != r.State || m.Fingerprint != r.Fingerprint || !bytes.Equal(m.Record, r.Record) {
			fail("results", fmt.Sprintf("%+v", m), fmt.Sprintf("%+v", r))
		}
		if m.State == storage.InFlight && (m.LeaseLeft <= 0 || r.LeaseLeft <= 0) {
			fail("lease left (must be positive)", m.LeaseLeft, r.LeaseLeft)
		}
		diff := m.LeaseLeft - r.LeaseLeft
		if diff != 0 && !(fraction && diff >= -time.Millisecond && diff <= time.Millisecond) {
			fail("lease left", m.LeaseLeft, r.LeaseLeft)
		}
	}
}

// The differential fuzz's vocabulary: a few keys, owners, fingerprints and
// records, so that random sequences collide often. The empty strings and
// the fingerprint over MaxFingerprintLen reach the ErrInvalid paths.
var (
	diffKeys    = []string{"a", "b", ""}
	diffOwners  = []string{"o1", "o2", "o3", ""}
	diffFPs     = []string{"", "fp1", "fp2", strings.Repeat("f", storage.MaxFingerprintLen+1)}
	diffRecords = [][]byte{[]byte("r1"), []byte("r2"), {}, {0, 0xff, 'D', 'P'}}
)

// diffOp is one step of a differential run.
type diffOp struct {
	kind       byte // 0 acquire, 1 complete, 2 release, 3 extend, 4 clock step, 5 issue, 6 acquire issued
	key, owner string
	fp         string
	record     []byte
	d          time.Duration // lease, ttl or clock step
}

func (o diffOp) String() string {
	switch o.kind {
	case 0:
		return fmt.Sprintf("Acquire(%q, %q, %.8q, %v)", o.key, o.owner, o.fp, o.d)
	case 1:
		return fmt.Sprintf("Complete(%q, %q, %q, %v)", o.key, o.owner, o.record, o.d)
	case 2:
		return fmt.Sprintf("Release(%q, %q)", o.key, o.owner)
	case 3:
		return fmt.Sprintf("Extend(%q, %q, %v)", o.key, o.owner, o.d)
	case 5:
		return fmt.Sprintf("Issue(%q, %v)", o.key, o.d)
	case 6:
		return fmt.Sprintf("AcquireIssued(%q, %q, %.8q, %v)", o.key, o.owner, o.fp, o.d)
	}
	return fmt.Sprintf("step %v", o.d)
}

// maxDiffOps bounds a run: miniredis builds a Lua state per script.
const maxDiffOps = 64

// issuedFrom is the first byte of an operation from which it is an Issue
// or an AcquireIssued. Below it, a byte decodes as it did before issued
// keys (the committed seeds have none above 120), and a byte and that
// byte plus 60 decode alike, so no operation of the others is lost.
const issuedFrom = 180

// decodeDiffOps reads two bytes per operation. The first picks the kind,
// key and owner: below issuedFrom, the kind is one of the first five; from
// issuedFrom on, an Issue or an AcquireIssued. The second picks the
// fingerprint or record (low two bits) and a duration: leases and TTLs of
// 0 to 15.75 ms in quarters of a millisecond (0 is invalid; a quarter is
// rounded up to a whole millisecond by both stores), and clock steps of 0
// to 63 ms, a quarter of them with a fraction of a millisecond.
func decodeDiffOps(data []byte) []diffOp {
	var ops []diffOp
	for i := 0; i+1 < len(data) && len(ops) < maxDiffOps; i += 2 {
		a, b := data[i], data[i+1]
		o := diffOp{
			kind:  a % 5,
			key:   diffKeys[int(a/5)%len(diffKeys)],
			owner: diffOwners[int(a/15)%len(diffOwners)],
		}
		if c := int(a) - issuedFrom; c >= 0 {
			o = diffOp{
				kind:  5 + byte(c%2),
				key:   diffKeys[c/2%len(diffKeys)],
				owner: diffOwners[c/6%len(diffOwners)],
			}
		}
		pick := int(b % 4)
		o.fp, o.record = diffFPs[pick], diffRecords[pick]
		o.d = time.Duration(b/4) * 250 * time.Microsecond
		if o.kind == 4 {
			o.d = time.Duration(b/4) * time.Millisecond
			if b%4 == 3 {
				o.d += 300 * time.Microsecond
			}
		}
		ops = append(ops, o)
	}
	return ops
}

// errClass names the kind of a store error, which is what must agree: the
// texts differ by the store's name.
func errClass(err error) string {
	switch {
	case err == nil:
		return "nil"
	case errors.Is(err, storage.ErrNotOwner):
		return "ErrNotOwner"
	case errors.Is(err, storage.ErrInvalid):
		return "ErrInvalid"
	case errors.Is(err, storage.ErrFull):
		return "ErrFull"
	case errors.Is(err, storage.ErrExists):
		return "ErrExists"
	}
	return "other: " + err.Error()
}
