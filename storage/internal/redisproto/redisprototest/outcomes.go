package redisprototest

import (
	"context"
	"crypto/rand"
	"errors"
	"strconv"
	"time"

	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/internal/redisproto"
)

// Op is one store operation with the outcome it must have.
type Op struct {
	Name string
	// Run runs the operation on s, and returns an error when it fails or
	// its outcome is not the one wanted.
	Run func(ctx context.Context, s Store) error
}

// acquireOp acquires key for owner, and wants the state want.
func acquireOp(name, key, owner string, want storage.State) Op {
	return Op{name, func(ctx context.Context, s Store) error {
		res, err := s.Acquire(ctx, key, owner, "fp", time.Minute)
		if err == nil && res.State != want {
			return errors.New("state " + res.State.String() + ", want " + want.String())
		}
		return err
	}}
}

// acquireIssuedOp acquires the issued key for owner, and wants the state
// want.
func acquireIssuedOp(name, key, owner string, want storage.State) Op {
	return Op{name, func(ctx context.Context, s Store) error {
		res, err := s.AcquireIssued(ctx, key, owner, "fp", time.Minute)
		if err == nil && res.State != want {
			return errors.New("state " + res.State.String() + ", want " + want.String())
		}
		return err
	}}
}

// wantErr runs f, and wants an error wrapping want.
func wantErr(want error, f func(ctx context.Context, s Store) error) func(ctx context.Context, s Store) error {
	return func(ctx context.Context, s Store) error {
		if err := f(ctx, s); !errors.Is(err, want) {
			return errors.New("error " + errString(err) + ", want " + want.Error())
		}
		return nil
	}
}

// Outcomes walks every outcome of every operation that writes, in order,
// on a prefix of its own: each script is first used at index 1 (acquire,
// which an Acquire sends after its SET NX GET found its own entry), 3
// (extend), 5 (release), 6 (complete), 13 (issue) and 15 (acquire
// issued). It leaves a done entry under "k" and one under "i", which
// Inspections then look up and list. Each sends one command, but those
// in [Commands].
var Outcomes = outcomes

// Commands are the operations of Outcomes that send more than one
// command, and how many, once the scripts are cached: an Acquire is a
// SET NX GET, then a PTTL for another owner's entry, or the Acquire
// script for its own (a resend) or an issued one.
var Commands = map[string]int64{
	"acquire again":        2, // SET, then the Acquire script renews the lease
	"acquire in flight":    2, // SET, then PTTL
	"acquire takes issued": 2, // SET, then the Acquire script takes it
}

// ProbeAt is the index in Outcomes of the first command of a new
// store's native path (see the redisproto package doc): the Extend of its
// own entry, held since its Acquire at index 0. On a server without SET
// IFEQ it is refused (the probe) and the script follows, a command more;
// on one with it, it is the whole operation, and the Extend script is
// first used at ProbeAt+1. Index 7 (complete) is the native path's other
// command there; the Complete script is first used at 6 either way.
const ProbeAt = 3

// Sends returns how many commands Outcomes[i] sends on a new store that
// has run Outcomes[:i], once the scripts are cached and the
// maxmemory-policy is known, on a server with the native path (native)
// or without; first reports whether it is the first use of a script,
// which costs a command more after SCRIPT FLUSH.
func Sends(i int, native bool) (n int64, first bool) {
	n = max(Commands[Outcomes[i].Name], 1)
	if i == ProbeAt && !native {
		n++
	}
	switch i {
	case 1, 5, 6, 13, 15:
		first = true
	case ProbeAt:
		first = !native
	case ProbeAt + 1:
		first = native
	}
	return n, first
}

// Native reports whether the server behind do takes SET IFEQ, the native
// path: it sends SET with IFEQ for a key that cannot exist, which such a
// server answers with nil and writes nothing, and another refuses as a
// syntax error.
func Native(ctx context.Context, do func(ctx context.Context, args ...string) (redisproto.Reply, error)) bool {
	_, err := do(ctx, "SET", "idem-test:native-probe:"+rand.Text(), "v", "IFEQ", "w")
	return err == nil
}

var outcomes = []Op{
	acquireOp("acquire new", "k", "o", storage.Acquired),
	acquireOp("acquire again", "k", "o", storage.Acquired),
	acquireOp("acquire in flight", "k", "o2", storage.InFlight),
	{"extend", func(ctx context.Context, s Store) error { return s.Extend(ctx, "k", "o", time.Minute) }},
	{"extend not owner", wantErr(storage.ErrNotOwner, func(ctx context.Context, s Store) error { return s.Extend(ctx, "k", "o2", time.Minute) })},
	{"release not owner", wantErr(storage.ErrNotOwner, func(ctx context.Context, s Store) error { return s.Release(ctx, "k", "o2") })},
	{"complete not owner", wantErr(storage.ErrNotOwner, func(ctx context.Context, s Store) error {
		return s.Complete(ctx, "k", "o2", []byte("rec"), time.Minute)
	})},
	{"complete", func(ctx context.Context, s Store) error {
		return s.Complete(ctx, "k", "o", []byte("rec"), time.Minute)
	}},
	{"complete resent", func(ctx context.Context, s Store) error {
		return s.Complete(ctx, "k", "o", []byte("rec"), time.Minute)
	}},
	acquireOp("acquire done", "k", "o2", storage.Done),
	acquireOp("acquire to release", "k2", "o", storage.Acquired),
	{"release", func(ctx context.Context, s Store) error { return s.Release(ctx, "k2", "o") }},
	{"release missing", func(ctx context.Context, s Store) error { return s.Release(ctx, "k2", "o") }},
	{"issue", func(ctx context.Context, s Store) error { return s.Issue(ctx, "i", time.Minute) }},
	{"issue exists", wantErr(storage.ErrExists, func(ctx context.Context, s Store) error { return s.Issue(ctx, "i", time.Minute) })},
	acquireIssuedOp("acquire issued, not issued", "never", "o", storage.NotIssued),
	acquireIssuedOp("acquire issued", "i", "o", storage.Acquired),
	acquireIssuedOp("acquire issued again", "i", "o", storage.Acquired),
	acquireIssuedOp("acquire issued in flight", "i", "o2", storage.InFlight),
	{"release to issued", func(ctx context.Context, s Store) error { return s.Release(ctx, "i", "o") }},
	{"release issued", func(ctx context.Context, s Store) error { return s.Release(ctx, "i", "o") }},
	{"extend issued", wantErr(storage.ErrNotOwner, func(ctx context.Context, s Store) error { return s.Extend(ctx, "i", "o", time.Minute) })},
	{"complete issued", wantErr(storage.ErrNotOwner, func(ctx context.Context, s Store) error {
		return s.Complete(ctx, "i", "o", []byte("rec"), time.Minute)
	})},
	acquireOp("acquire takes issued", "i", "o", storage.Acquired),
	{"complete taken from an issue", func(ctx context.Context, s Store) error {
		return s.Complete(ctx, "i", "o", []byte("rec"), time.Minute)
	}},
	acquireIssuedOp("acquire issued done", "i", "o2", storage.Done),
}

// Inspections follow Outcomes: they look up the done entry under "k" and
// list the two entries Outcomes leaves. They change nothing.
var Inspections = []Op{
	{"lookup", func(ctx context.Context, s Store) error {
		e, err := s.Lookup(ctx, "k", true)
		if err == nil && (e.State != storage.Done || string(e.Record) != "rec") {
			return errors.New("entry " + e.State.String() + " " + string(e.Record) + ", want done with rec")
		}
		return err
	}},
	{"list", func(ctx context.Context, s Store) error {
		// One page on a server of a few keys; a shared one takes more.
		q, n := storage.Query{Limit: 1000}, 0
		for {
			page, err := s.List(ctx, q)
			if err != nil {
				return err
			}
			if n += len(page.Entries); page.Next == "" {
				break
			}
			q.Cursor = page.Next
		}
		if n != 2 {
			return errors.New("listed " + strconv.Itoa(n) + " entries, want k and i")
		}
		return nil
	}},
}
