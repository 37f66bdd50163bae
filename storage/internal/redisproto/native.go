package redisproto

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The native path.
//
// Valkey 8.1 and Redis 8.4 have a native compare-and-set: SET key value
// IFEQ current [PX ms] writes value only where the key holds exactly
// current, and answers OK, or nil (changing nothing) where it does not.
// On such a server Complete and a lease renewal (Extend) need no script:
// the owner's 'P' entry is the value its own Acquire wrote, which the
// store that wrote it holds ([Native.Hold]), so
//
//	Complete: SET key <done entry> IFEQ <the owner's P entry> PX ttl
//	Extend:   SET key <the owner's P entry> IFEQ <the same> PX lease
//
// are the whole operation, one plain command each, of about the cost of
// the SET that made the entry. The done entry has the layout the script
// writes ([AppendDone]), so instances on the script path and on the
// native path share one server during a rolling upgrade.
//
// Anything else goes to the script, which stays the one place that
// decides an answer the native command does not give: a nil answer (the
// entry is no longer the owner's 'P' entry as written: completed already
// by a resend, taken over after the lease ran out, removed, or a 'Q'
// entry taken from an issue), an entry this store did not write (another
// instance's Acquire, or more than [MaxHeld] in flight), an error reply
// (WRONGTYPE). Release stays a script: Valkey 8.1 has no compare-and-
// delete (DELIFEQ came in Valkey 9.0).
//
// The first native command is the probe: a server that does not know
// IFEQ (Redis before 8.4, Valkey before 8.1) answers "ERR syntax error"
// (any error reply but WRONGTYPE counts) and writes nothing, the call
// goes on with the script, and the store sends scripts alone for
// [CheckEvery]; then it tries again, so a server
// upgraded in place (or a cluster whose nodes differ during its own
// upgrade) is found out without a restart. The probe is the command
// itself, not a version string: managed services and forks report
// versions that do not tell.

// MaxHeld bounds the entries a [Native] holds at once. Past it, an
// Acquire's entry is not held, and its Complete runs the script: the
// memory of a store stays bounded whatever the load (an entry held is
// about a hundred bytes: its key, owner and value).
const MaxHeld = 1 << 16

// Native is the state of a store's native path: whether the server takes
// IFEQ, and the 'P' entries this store wrote that are still in flight.
// Its zero value is ready: it tries the native path. It is safe for
// concurrent use.
type Native struct {
	// Off keeps the store on the scripts (set before first use): an
	// instance of a release before the native path, in tests.
	Off bool
	// Now reads the clock; [time.Now] when nil. It dates the entries
	// held, so that those whose lease ran out are forgotten, and a refusal.
	Now func() time.Time

	refusedAt atomic.Int64 // Unix ns of the last refusal; 0 when none stands

	mu    sync.Mutex
	held  map[string]held // by the caller's key (without the store's prefix)
	sweep int             // the size at which Hold next forgets lapsed entries
}

// held is an entry that a store wrote, in flight.
type held struct {
	owner string
	val   []byte    // the 'P' entry, as written
	until time.Time // when its lease runs out, by Native.now
}

func (n *Native) now() time.Time {
	if n.Now != nil {
		return n.Now()
	}
	return time.Now()
}

// Use reports whether the store is to try the native path now: not Off,
// and no refusal younger than [CheckEvery].
func (n *Native) Use() bool {
	if n.Off {
		return false
	}
	at := n.refusedAt.Load()
	if at == 0 {
		return true
	}
	if n.now().Sub(time.Unix(0, at)) < CheckEvery {
		return false
	}
	n.refusedAt.CompareAndSwap(at, 0)
	return true
}

// Refused records that the server answered a native command with msg,
// an error reply, and reports whether the store now leaves the native
// path for [CheckEvery]: for every error reply but WRONGTYPE (a value of
// another type under that one key). Redis before 8.4 answers "ERR syntax
// error"; a fork or a proxy may word it otherwise, or refuse the command
// outright, and a transient error (LOADING, OOM) costs no more than a
// minute of scripts. Nothing was written either way; the caller goes on
// with the script.
func (n *Native) Refused(msg string) bool {
	if strings.HasPrefix(msg, "WRONGTYPE") {
		return false
	}
	n.refusedAt.Store(n.now().UnixNano())
	n.mu.Lock()
	n.held, n.sweep = nil, 0
	n.mu.Unlock()
	return true
}

// Hold records val, the 'P' entry ([AppendProcessing]) that the store
// wrote under key for owner with lease, when the native path is in use
// and fewer than [MaxHeld] are held. It keeps val, which the caller
// must not change afterwards. An entry held before under key is
// replaced.
func (n *Native) Hold(key, owner string, val []byte, lease time.Duration) {
	if !n.Use() {
		return
	}
	now := n.now()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.held == nil {
		n.held = make(map[string]held)
	}
	if len(n.held) >= n.sweep {
		for k, h := range n.held {
			if !now.Before(h.until) {
				delete(n.held, k)
			}
		}
		n.sweep = max(2*len(n.held), 1024)
	}
	if len(n.held) >= MaxHeld {
		return
	}
	n.held[key] = held{owner: owner, val: val, until: now.Add(lease)}
}

// Held returns the 'P' entry held for key and owner, or nil when none
// is (or the native path is not in use). The caller must not change it.
func (n *Native) Held(key, owner string) []byte {
	if !n.Use() {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if h, ok := n.held[key]; ok && h.owner == owner {
		return h.val
	}
	return nil
}

// Renewed moves the end of the lease of the entry held for key and
// owner to lease from now.
func (n *Native) Renewed(key, owner string, lease time.Duration) {
	until := n.now().Add(lease)
	n.mu.Lock()
	defer n.mu.Unlock()
	if h, ok := n.held[key]; ok && h.owner == owner {
		h.until = until
		n.held[key] = h
	}
}

// Drop forgets the entry held for key and owner: it is done, released or
// no longer the owner's.
func (n *Native) Drop(key, owner string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if h, ok := n.held[key]; ok && h.owner == owner {
		delete(n.held, key)
	}
}

// Len returns how many entries are held. For tests.
func (n *Native) Len() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.held)
}

// AppendDone appends to dst the done entry that Complete writes over p,
// the owner's 'P' entry as [AppendProcessing] wrote it: stamped now, with
// p's fingerprint, the owner and the record. It is the value the
// Complete script writes from the same arguments, byte for byte. p must
// be a 'P' entry of owner ([Native.Held] gives one).
func AppendDone(dst []byte, now time.Time, p []byte, owner string, rec []byte) []byte {
	n := int(p[8]) // 'T', 6 bytes of stamp, 'P', then the fingerprint's length
	dst = append(AppendStamp(append(dst, 'T'), now), 'C')
	dst = append(dst, p[8:9+n]...)
	dst = AppendUvarint(dst, uint64(len(owner)))
	dst = append(dst, owner...)
	return append(dst, rec...)
}
