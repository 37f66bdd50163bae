package storage

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrNotFound means [Inspector.Lookup] or [Inspector.Remove] found no
// live entry under the key. Nothing was changed.
var ErrNotFound = errors.New("storage: no entry")

// ErrChanged means [Inspector.Remove] found an entry under the key, but
// not the one it was asked to remove: its Version differs (it changed
// state or owner since it was shown: an execution completed it, it was
// released and acquired again, ...). Nothing was removed; Remove returns
// the entry as it is now.
var ErrChanged = errors.New("storage: entry changed")

// Inspector is an optional interface of a [Store] that shows an operator
// what it holds and removes an entry by hand: "why does this retry get
// 409?", "which executions are stuck, and since when?", "forget this key,
// the order was refunded by hand". Every store of this module implements
// it; the middleware never calls it. storagetest runs its clauses when the
// store implements it.
//
// Its methods take the storage key, the key the middleware gives Acquire
// (idem's Info.StorageKey), without the store's own prefix. They read the
// store's clock, as Acquire does (Redis's and PostgreSQL's, not the
// caller's): Since and Expires are times of that clock, LeaseLeft a
// duration measured on it.
//
// Lookup and List change nothing: an entry they show is neither renewed
// nor taken, and an in-flight entry's lease runs on.
type Inspector interface {
	Store

	// Lookup returns the live entry under key, or an error wrapping
	// ErrNotFound when there is none (never created, expired, or
	// removed). Entry.Record holds a done entry's record only when
	// withRecord is true (it may be large, and it holds the response
	// the application sent: a body an operator should not see by
	// default); otherwise it is nil, and Entry.Size says its length.
	Lookup(ctx context.Context, key string, withRecord bool) (Entry, error)

	// List returns a page of the live entries that q selects, without
	// their records. A listing starts with an empty q.Cursor and goes on
	// with each page's Next, the rest of q unchanged, until Next is
	// empty. Each call does bounded work, whatever the store holds, so
	// a page may hold fewer than q.Limit entries, even none, while Next
	// is not empty. Every entry that q selects during the whole listing
	// appears in it at least once (a store may show one twice); one
	// created, changed or removed meanwhile may or may not. The order of
	// the entries is the store's (see its documentation); a caller that
	// wants them by age sorts them. An error wrapping ErrInvalid for a
	// cursor the store did not make, or a State outside those of [Entry].
	List(ctx context.Context, q Query) (Page, error)

	// Remove deletes the entry under key if it is still the one that
	// Lookup or List showed with version (its [Entry.Version]), and
	// returns it as it was, without its record. The check and the
	// deletion are one atomic step, so an operator who saw an execution
	// in flight never removes the done record its completion wrote
	// meanwhile (a retry would then run the work again).
	//
	// When the entry under key has another version, Remove deletes
	// nothing and returns the entry as it is now, without its record,
	// with an error wrapping ErrChanged; when there is none, an error
	// wrapping ErrNotFound; an empty version is ErrInvalid. Once removed,
	// the key is free: the next Acquire runs the work (for a done or
	// committed entry: again). An execution whose in-flight or committed
	// entry was removed learns it when it completes (ErrNotOwner): its
	// response then reaches its client, and is not stored. An issued key
	// is spent.
	Remove(ctx context.Context, key, version string) (Entry, error)
}

// Issued is the State of an [Entry] issued by [Issuer.Issue] and not yet
// taken. Acquire and AcquireIssued never answer it.
const Issued = Committed + 1

// Entry is what [Inspector] shows of one entry.
type Entry struct {
	// Key is the storage key, without the store's prefix.
	Key string

	// State is InFlight (processing: an execution holds the lease),
	// Done, Committed (whether or not its owner's lease still runs), or
	// Issued.
	State State

	// Fingerprint is the fingerprint of the request that acquired the
	// entry; empty for an issued entry.
	Fingerprint string

	// Since is when the entry entered its state: for an in-flight or
	// committed entry, when the execution that holds it acquired it (a
	// renewal does not move it); for a done entry, when it was
	// completed; for an issued entry, when it was issued, or went back
	// to issued. Zero when the store cannot tell (an entry written by a
	// release of the store that did not record it).
	Since time.Time

	// LeaseLeft is how long the lease of an in-flight or committed
	// entry still runs (of a committed entry, 0 once its owner's lease
	// has run out: Acquire then answers Committed); 0 for the others.
	LeaseLeft time.Duration

	// Expires is when the store forgets the entry unless something
	// renews it: the end of an in-flight entry's lease, the end of a
	// done, committed or issued entry's TTL.
	Expires time.Time

	// Size is the length of a done entry's record, in bytes; 0 for the
	// others.
	Size int

	// Record is a done entry's record, from Lookup with withRecord only.
	// It may share memory with the store: the caller must not modify it.
	Record []byte

	// Version names this incarnation of the entry, for [Inspector.Remove]:
	// it changes whenever the entry changes state or owner (acquired,
	// completed, released, fenced, issued, taken from an issue, removed
	// and created again), and never when only its lease is renewed (an
	// Extend, or an Acquire resent by its owner). It is opaque, short,
	// printable ASCII without spaces, never empty, and reveals no owner
	// token: an operator's tool may show it and send it back.
	Version string
}

// Query selects the entries of a listing ([Inspector.List]).
type Query struct {
	// State selects the entries in that state: InFlight, Done,
	// Committed or Issued. 0 selects every entry.
	State State

	// MinAge selects the entries whose Since is at least MinAge ago,
	// such as the executions in flight for longer than a minute; an
	// entry whose Since is unknown is selected only when MinAge is 0.
	// 0 selects every age.
	MinAge time.Duration

	// Cursor is empty for the first page, and then the previous page's
	// Next.
	Cursor string

	// Limit is the most entries a page holds: 100 when <= 0; a store
	// may lower it (every store of this module to 1000).
	Limit int
}

// Page is one page of a listing.
type Page struct {
	// Entries are the entries of this page, without their records.
	Entries []Entry

	// Next is the Cursor of the next page; empty when the listing is
	// over.
	Next string
}

// Listing limits: [Query.Limit]'s default, and the highest limit the
// stores of this module accept.
const (
	DefaultListLimit = 100
	MaxListLimit     = 1000
)

// CheckQuery returns q with its Limit set to what a store of this module
// uses (DefaultListLimit when <= 0, at most MaxListLimit), or an error
// wrapping ErrInvalid when its State or MinAge is invalid. Stores call it
// first; so may a store written outside this module.
func CheckQuery(q Query) (Query, error) {
	switch q.State {
	case 0, InFlight, Done, Committed, Issued:
	default:
		return q, fmt.Errorf("%w: a listing selects in flight, done, committed or issued entries, not %v", ErrInvalid, q.State)
	}
	if q.MinAge < 0 {
		return q, fmt.Errorf("%w: MinAge %v", ErrInvalid, q.MinAge)
	}
	switch {
	case q.Limit <= 0:
		q.Limit = DefaultListLimit
	case q.Limit > MaxListLimit:
		q.Limit = MaxListLimit
	}
	return q, nil
}
