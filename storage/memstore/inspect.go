package memstore

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/storage"
)

// view returns what storage.Inspector shows of e at now.
func (e *entry) view(now time.Time, withRecord bool) storage.Entry {
	v := storage.Entry{Key: e.key, Fingerprint: e.fingerprint, Since: e.since, Expires: e.expires}
	switch {
	case e.done:
		v.State, v.Size = storage.Done, len(e.record)
		if withRecord {
			v.Record = e.record
		}
	case e.owner == "":
		v.State = storage.Issued
	default:
		v.State, v.LeaseLeft = storage.InFlight, e.expires.Sub(now)
	}
	v.Version = e.version(v.State)
	return v
}

// version is the entry's storage.Entry.Version: a hash of its state, when
// it entered it and its owner (the one holding it, or the one that
// completed it), which change together with every transition but a
// renewal. The owner is hashed, so the version does not reveal it.
func (e *entry) version(state storage.State) string {
	h := fnv.New64a()
	var b [9]byte
	b[0] = byte(state)
	binary.BigEndian.PutUint64(b[1:], uint64(e.since.UnixNano()))
	h.Write(b[:])
	h.Write([]byte(e.owner))
	return strconv.FormatUint(h.Sum64(), 36)
}

// Lookup implements [storage.Inspector.Lookup]. The context is not used.
// Errors wrap [storage.ErrNotFound].
func (s *Store) Lookup(_ context.Context, key string, withRecord bool) (storage.Entry, error) {
	sh := s.shardOf(key)
	sh.mu.Lock()
	defer sh.unlock()
	now := s.now()
	e := sh.live(key, now)
	if e == nil {
		return storage.Entry{}, fmt.Errorf("memstore: lookup: %w", storage.ErrNotFound)
	}
	return e.view(now, withRecord), nil
}

// List implements [storage.Inspector.List]. Its entries come oldest Since
// first (then by key), across pages and shards. Each call reads every
// entry of the store, one shard at a time under the shard's lock (on a
// store of 100,000 entries, a few milliseconds in all, during which other
// calls on that shard wait), and sorts the ones q selects after it
// unlocks. The context is not used. Errors wrap
// [storage.ErrInvalid].
func (s *Store) List(_ context.Context, q storage.Query) (storage.Page, error) {
	q, err := storage.CheckQuery(q)
	if err != nil {
		return storage.Page{}, fmt.Errorf("memstore: list: %w", err)
	}
	after, err := parseCursor(q.Cursor)
	if err != nil {
		return storage.Page{}, fmt.Errorf("memstore: list: %w", err)
	}
	var found []storage.Entry
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		now := s.now()
		for _, e := range sh.entries {
			if !now.Before(e.expires) || (q.Cursor != "" && !after.before(e.since, e.key)) {
				continue
			}
			v := e.view(now, false)
			if (q.State == 0 || v.State == q.State) && now.Sub(v.Since) >= q.MinAge {
				found = append(found, v)
			}
		}
		sh.mu.Unlock()
	}
	slices.SortFunc(found, func(a, b storage.Entry) int {
		return cmp.Or(cmp.Compare(a.Since.UnixNano(), b.Since.UnixNano()), strings.Compare(a.Key, b.Key))
	})
	if len(found) <= q.Limit {
		return storage.Page{Entries: found}, nil
	}
	found = found[:q.Limit:q.Limit]
	last := found[len(found)-1]
	return storage.Page{Entries: found, Next: strconv.FormatInt(last.Since.UnixNano(), 10) + ":" + last.Key}, nil
}

// cursor is where a listing goes on: after the entry of this Since and
// key, in the order of List.
type cursor struct {
	since int64 // Unix nanoseconds
	key   string
}

// parseCursor reads a Page.Next that List made: "<since>:<key>". The
// empty cursor is the start.
func parseCursor(c string) (cursor, error) {
	if c == "" {
		return cursor{}, nil
	}
	n, key, ok := strings.Cut(c, ":")
	since, err := strconv.ParseInt(n, 10, 64)
	if !ok || err != nil {
		return cursor{}, fmt.Errorf("%w: cursor %q was not made by this store", storage.ErrInvalid, c)
	}
	return cursor{since, key}, nil
}

// before reports whether c comes before the entry of this Since and key.
func (c cursor) before(since time.Time, key string) bool {
	n := since.UnixNano()
	return c.since < n || (c.since == n && c.key < key)
}

// Remove implements [storage.Inspector.Remove]. The context is not used.
// Errors wrap [storage.ErrNotFound], [storage.ErrChanged] or
// [storage.ErrInvalid].
func (s *Store) Remove(_ context.Context, key, version string) (storage.Entry, error) {
	if version == "" {
		return storage.Entry{}, fmt.Errorf("memstore: remove: %w: no version", storage.ErrInvalid)
	}
	sh := s.shardOf(key)
	sh.mu.Lock()
	defer sh.unlock()
	now := s.now()
	e := sh.live(key, now)
	if e == nil {
		return storage.Entry{}, fmt.Errorf("memstore: remove: %w", storage.ErrNotFound)
	}
	v := e.view(now, false)
	if v.Version != version {
		return v, fmt.Errorf("memstore: remove: %w: it is %v now", storage.ErrChanged, v.State)
	}
	sh.remove(e)
	return v, nil
}
