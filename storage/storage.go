// Package storage defines the contract between the idem middleware and the
// place where it keeps idempotency records.
//
// The package holds only the [Store] interface, its optional interface
// [Issuer], their result types and errors, and the [Lease] an execution
// carries in its context, so
// that a program that uses the in-memory store never compiles a Redis or
// PostgreSQL client. Implementations live below it: storage/memstore (one
// process), storage/redisstore and storage/pgstore (shared by every
// instance of a service). storage/storagetest is an exported contract
// suite that every Store, including one written by a user, must pass.
//
// # The protocol
//
// An entry is processing or done. [Store.Acquire] creates it in the
// processing state, held by an owner token for a lease; the owner extends
// the lease with [Store.Extend] while its handler runs and ends it with
// either [Store.Complete] (the entry becomes done, holds the encoded
// response for the TTL and remembers the owner that completed it) or
// [Store.Release] (the entry is deleted so a retry may run the handler
// again). An entry whose lease runs out disappears, so a crashed process
// never holds a key for longer than its lease. An [Issuer] adds a third
// state, issued, before processing (and to which Release returns an
// entry taken from an issue).
//
// # Committed entries
//
// A store whose completion can join the application's own transaction
// (pgstore's Fence) adds a fourth state, committed: the owner's work took
// effect, committed together with the entry, and its response is not
// stored yet. The owner still ends it as it ends a processing entry:
// Complete makes it done, Extend renews its lease, and Release ends the
// lease but keeps the entry, since the work must never run again. While
// the owner's lease runs, Acquire answers [InFlight], so a retry waits for
// the response; once the lease has run out (the owner's process died
// between its commit and its Complete, or it released the entry), Acquire
// and AcquireIssued answer [Committed]: the work is done and its response
// is lost. The entry stays committed until the TTL the store's fence gave
// it. The middleware answers Committed as a done entry whose response it
// could not keep: 409 with ErrNotReplayable, or what WithRebuild answers.
// A store without such a fence never answers Committed.
//
// Every method is atomic and costs one round trip. Every method is safe to
// run twice with the same arguments (a Redis client may resend a command
// after a timeout): acquiring again with the same owner succeeds and renews
// the lease, completing again with the same owner and the same record
// succeeds, releasing an entry that is already gone succeeds. The
// exception is [Issuer.Issue], whose resend answers ErrExists: its
// caller, who chose a fresh random key, takes that as success. A done
// entry takes a Complete as a resend only from the owner that completed
// it: any other owner gets ErrNotOwner, even with an identical record, so
// an execution that lost its lease while another owner ran and completed
// is never taken for a resend, and a double run is not hidden.
package storage

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Errors returned by stores. Stores wrap them with %w and may add context, so
// compare with [errors.Is].
var (
	// ErrNotOwner means the entry is not, or no longer, held by the given
	// owner: its lease ran out and it vanished or was taken by another
	// owner, or it is already done (and, for Complete, not by this owner
	// with this record). Nothing was changed.
	ErrNotOwner = errors.New("storage: lease not held by this owner")

	// ErrFull means the store is at its size bound and holds nothing it may
	// evict (a store never evicts an entry in flight). Nothing was changed.
	ErrFull = errors.New("storage: store is full")

	// ErrInvalid means the arguments break the contract: an empty key or
	// owner, a fingerprint longer than [MaxFingerprintLen], or a lease or TTL
	// that is not positive. Nothing was changed.
	ErrInvalid = errors.New("storage: invalid argument")

	// ErrTooLarge means Complete refused the record because it is larger
	// than the store can keep (each store documents its limit). The
	// refusal is permanent, not an outage: nothing was changed, the entry
	// is still the owner's, and a Complete with a smaller record succeeds.
	// The middleware then completes the entry with a record that says the
	// response was not kept, so that retries get 409 ErrNotReplayable and
	// never run the handler again.
	ErrTooLarge = errors.New("storage: record too large for the store")

	// ErrNotDurable means Complete wrote the record but could not confirm
	// the durability the store was configured to wait for (the Redis
	// stores' WithDurability: so many replicas, or the append-only file's
	// fsync, within a timeout). The entry is done, as after a nil error,
	// and replays; it is lost only if the server fails before the write
	// reaches where it was to wait for. The middleware takes it as a
	// success: the response is sent once and not retried, and the
	// observer's Executed event carries the error.
	ErrNotDurable = errors.New("storage: record written, its durability not confirmed")

	// ErrExists means [Issuer.Issue] found an entry, in any state, under
	// the key it was to issue. Nothing was changed.
	ErrExists = errors.New("storage: entry exists")

	// ErrCorrupt means the value under the key is not an entry of this
	// store: something else wrote there (a Redis hash or list, a string of
	// another application's), or the entry is damaged. No call can take
	// the key until someone removes the value; nothing was changed.
	ErrCorrupt = errors.New("storage: the value under the key is not an idem entry")
)

// MaxFingerprintLen is the longest fingerprint a Store must accept.
const MaxFingerprintLen = 255

// State is the outcome of [Store.Acquire] or [Issuer.AcquireIssued].
type State uint8

const (
	// Acquired means the caller now holds the lease on a processing entry.
	Acquired State = iota + 1
	// InFlight means another owner holds the lease on a processing entry.
	InFlight
	// Done means a completed entry exists; [Result.Record] holds it.
	Done
	// NotIssued means [Issuer.AcquireIssued] found no entry under the
	// key: it was never issued, its issue expired, or it was used and
	// its entry is gone. Nothing was created.
	NotIssued
	// Committed means a committed entry whose owner's lease has run out
	// (see Committed entries in the package documentation): its work took
	// effect, its response was never stored. [Result.Fingerprint] is set,
	// [Result.Record] is nil. Nothing was created.
	Committed
)

// String returns "acquired", "in flight", "done", "not issued",
// "committed", "issued" or "State(n)".
func (s State) String() string {
	switch s {
	case Acquired:
		return "acquired"
	case InFlight:
		return "in flight"
	case Done:
		return "done"
	case NotIssued:
		return "not issued"
	case Committed:
		return "committed"
	case Issued:
		return "issued"
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// Result is what [Store.Acquire] or [Issuer.AcquireIssued] found or did.
type Result struct {
	// State says which outcome happened (NotIssued from AcquireIssued
	// only; Committed from a store with committed entries only).
	State State

	// Fingerprint is the fingerprint given when the existing entry was
	// acquired. Set for InFlight, Done and Committed; empty for Acquired
	// and NotIssued.
	Fingerprint string

	// LeaseLeft is how long the other owner's lease still runs. Set for
	// InFlight only; at least one millisecond.
	LeaseLeft time.Duration

	// Record is the record stored by [Store.Complete]. Set for Done only.
	// It may share memory with the store: the caller must not modify it.
	Record []byte
}

// Store keeps idempotency entries. Implementations must be safe for
// concurrent use, and each method must be atomic with respect to every
// other call on the same key, from any process sharing the store.
//
// Keys are opaque strings made by the middleware (already hashed, so they
// are short and contain no user input). Stores may add a prefix of their
// own. Lease and TTL are rounded up to whole milliseconds.
type Store interface {
	// Acquire takes the lease on key for owner, or reports what holds it.
	//
	//   - No entry (or an expired one): a processing entry is created,
	//     owned by owner, remembering fingerprint, expiring after lease.
	//     The result is Acquired.
	//   - An issued entry (in an [Issuer]): taken as AcquireIssued takes
	//     it. The result is Acquired.
	//   - A processing entry owned by owner: its lease is renewed to lease
	//     and the result is Acquired (a resend of the same acquire).
	//   - A processing entry owned by someone else: InFlight, with the
	//     entry's fingerprint and the lease it has left.
	//   - A done entry: Done, with its fingerprint and record.
	//   - A committed entry (in a store that has them): InFlight while its
	//     owner's lease runs, then Committed, with its fingerprint.
	//
	// It returns ErrInvalid for an empty key or owner, a fingerprint over
	// MaxFingerprintLen bytes or a lease <= 0, and ErrFull when a bounded
	// store has no room; any other error means the store could not be
	// reached or answered nonsense, and nothing is known about the entry.
	Acquire(ctx context.Context, key, owner, fingerprint string, lease time.Duration) (Result, error)

	// Complete turns owner's processing (or committed) entry into a done
	// entry that holds record, remembers owner as the one that completed
	// it and expires after ttl; the fingerprint is kept. The store must not retain record
	// after Complete returns (the caller reuses the buffer): it copies what
	// it keeps. If the entry is already done, completed by this owner with
	// exactly this record, Complete returns nil (a resend). Otherwise, when
	// owner does not hold the entry (missing, issued, held by another
	// owner, done by another owner even with an identical record, or done
	// with another record), it returns ErrNotOwner and changes nothing.
	// ErrInvalid for a ttl <= 0. A record over the store's documented
	// size limit is ErrTooLarge, and changes nothing; a store must accept
	// any record of up to 1 KiB.
	Complete(ctx context.Context, key, owner string, record []byte, ttl time.Duration) error

	// Release deletes owner's processing entry so that a later Acquire
	// starts afresh; the owner's committed entry is kept, and its lease
	// ends. A missing entry is not an error (a resend, or the lease
	// ran out: either way nothing is held). An entry held by another owner,
	// or a done entry, is left alone and ErrNotOwner is returned. In a
	// store that is an [Issuer], an entry that was issued goes back to
	// the issued state instead of being deleted, and Release given an
	// issued entry returns nil and changes nothing (a resend).
	Release(ctx context.Context, key, owner string) error

	// Extend renews owner's lease to lease from now. It returns ErrNotOwner
	// when owner does not hold a processing entry for key (an issued or
	// done entry has no lease), and ErrInvalid for a lease <= 0. The lease
	// of the owner's committed entry is renewed too.
	Extend(ctx context.Context, key, owner string, lease time.Duration) error
}

// Issuer is an optional interface of a [Store] that keeps server-issued
// keys: keys the server hands out (with a form, say) and that a route then
// accepts only once they exist. Every store of this module implements it;
// the middleware's WithIssuedKeys needs it.
//
// An issued entry is a third state beside processing and done: a vacancy
// that only AcquireIssued may take, kept for the TTL given to Issue.
// Taking it is the key's first use, in the same single atomic call (and
// round trip) that acquires the lease. From then on the entry behaves as
// any other, except when it is released: an entry that came from an issue
// goes back to the issued state for the issue's full TTL again, so the
// key can be used again after a failed execution, instead of being
// deleted. An entry whose lease runs out disappears as any other (the
// process that held it died): its key is spent.
//
// storagetest runs the Issuer clauses when the store implements it.
type Issuer interface {
	Store

	// Issue creates an issued entry for key, expiring after ttl. It
	// returns ErrExists, changing nothing, when key has an entry in any
	// state (issued, processing or done); ErrInvalid for an empty key or
	// a ttl <= 0.
	Issue(ctx context.Context, key string, ttl time.Duration) error

	// AcquireIssued is [Store.Acquire] for a key that must have been
	// issued:
	//
	//   - No entry (never issued, expired, or spent): the result is
	//     NotIssued and nothing is created.
	//   - An issued entry: it becomes a processing entry owned by owner,
	//     remembering fingerprint, expiring after lease, and remembering
	//     the issue's TTL for Release. The result is Acquired.
	//   - A processing or done entry: exactly as Acquire (Acquired for the
	//     same owner, InFlight, Done).
	//
	// Errors as Acquire. Acquire itself, given the key of an issued entry,
	// takes it as AcquireIssued does.
	AcquireIssued(ctx context.Context, key, owner, fingerprint string, lease time.Duration) (Result, error)
}

// CheckAcquire returns an error wrapping ErrInvalid when the arguments of
// an Acquire break the contract, and nil otherwise. Stores call it first;
// so may a store written outside this module.
func CheckAcquire(key, owner, fingerprint string, lease time.Duration) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty key", ErrInvalid)
	case owner == "":
		return fmt.Errorf("%w: empty owner", ErrInvalid)
	case len(fingerprint) > MaxFingerprintLen:
		return fmt.Errorf("%w: fingerprint of %d bytes", ErrInvalid, len(fingerprint))
	case lease <= 0:
		return fmt.Errorf("%w: lease %v", ErrInvalid, lease)
	}
	return nil
}
