// Package memstore is an in-memory [storage.Store] for one process: tests,
// demos and single-instance services. Records are lost when the process
// exits and are not shared with other processes; use storage/redisstore for
// a service with more than one instance.
//
// The store is safe for concurrent use, expires entries by their TTL (read
// from an injectable clock), bounds its size without ever evicting an entry
// in flight, and runs one janitor goroutine that [Store.Close] stops.
package memstore

import (
	"bytes"
	"container/list"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/idemkit/idem/storage"
)

// Defaults of the options.
const (
	DefaultMaxEntries      = 100_000
	DefaultCleanupInterval = time.Minute
)

// Store is an in-memory storage.Store. Create it with [New].
type Store struct {
	now     func() time.Time
	max     int
	mu      sync.Mutex
	entries map[string]*entry
	done    list.List // done entries, oldest completed first; Value is *entry
	bytes   int
	stop    chan struct{}
	stopped sync.WaitGroup
	once    sync.Once

	cleanupEvery time.Duration
}

var _ storage.Store = (*Store)(nil)

type entry struct {
	key         string
	fingerprint string
	owner       string // set while processing
	record      []byte // set when done
	done        bool
	expires     time.Time
	elem        *list.Element // position in Store.done when done
}

func (e *entry) size() int { return len(e.key) + len(e.fingerprint) + len(e.owner) + len(e.record) }

// Option configures a Store.
type Option func(*Store)

// WithClock sets the clock that decides expiry. Default time.Now; a nil
// function keeps the default. Tests use it to expire entries without
// sleeping.
func WithClock(now func() time.Time) Option {
	return func(s *Store) {
		if now != nil {
			s.now = now
		}
	}
}

// WithMaxEntries bounds the number of entries. Default 100 000; n <= 0
// keeps the default. When the store is full, an Acquire of a new key evicts
// the done entry completed longest ago or, when there is none, an entry
// whose lease has expired; an entry in flight is never evicted, so when
// only those remain Acquire fails with an error wrapping storage.ErrFull.
func WithMaxEntries(n int) Option {
	return func(s *Store) {
		if n > 0 {
			s.max = n
		}
	}
}

// WithCleanupInterval sets how often the janitor removes expired entries.
// Default one minute; d <= 0 keeps the default. Expired entries are treated
// as absent at once whatever this interval; the janitor only frees their
// memory.
func WithCleanupInterval(d time.Duration) Option {
	return func(s *Store) {
		if d > 0 {
			s.cleanupEvery = d
		}
	}
}

// New returns an empty Store and starts its janitor. Call Close to stop it.
func New(opts ...Option) *Store {
	s := &Store{now: time.Now, max: DefaultMaxEntries, entries: make(map[string]*entry), stop: make(chan struct{}), cleanupEvery: DefaultCleanupInterval}
	for _, o := range opts {
		if o != nil {
			o(s)
		}
	}
	s.stopped.Add(1)
	go s.janitor(s.cleanupEvery)
	return s
}

// Close stops the janitor and waits for it to exit. The store stays
// usable. Close is idempotent and safe for concurrent use; it always
// returns nil.
func (s *Store) Close() error {
	s.once.Do(func() { close(s.stop) })
	s.stopped.Wait()
	return nil
}

func (s *Store) janitor(every time.Duration) {
	defer s.stopped.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.sweep()
		}
	}
}

// sweep removes every expired entry.
func (s *Store) sweep() {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for _, e := range s.entries {
		if !now.Before(e.expires) {
			s.remove(e)
		}
	}
}

// Len returns the number of entries held, expired ones not yet swept
// included.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.entries)
}

// Bytes returns the bytes of keys, fingerprints, owner tokens and records
// held: the payload, without the map's and the entries' own overhead (about
// 200 bytes per entry on 64-bit platforms).
func (s *Store) Bytes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bytes
}

func (s *Store) remove(e *entry) {
	delete(s.entries, e.key)
	if e.elem != nil {
		s.done.Remove(e.elem)
		e.elem = nil
	}
	s.bytes -= e.size()
}

// live returns the unexpired entry for key, dropping an expired one.
func (s *Store) live(key string, now time.Time) *entry {
	e := s.entries[key]
	if e != nil && !now.Before(e.expires) {
		s.remove(e)
		return nil
	}
	return e
}

// roundUp gives d whole milliseconds, at least one, as Redis would keep it.
func roundUp(d time.Duration) time.Duration {
	return (d + time.Millisecond - 1).Truncate(time.Millisecond)
}

func invalid(what string) error { return fmt.Errorf("memstore: %w: %s", storage.ErrInvalid, what) }

// Acquire implements storage.Store.
func (s *Store) Acquire(_ context.Context, key, owner, fingerprint string, lease time.Duration) (storage.Result, error) {
	if err := storage.CheckAcquire(key, owner, fingerprint, lease); err != nil {
		return storage.Result{}, fmt.Errorf("memstore: %w", err)
	}
	lease = roundUp(lease)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if e := s.live(key, now); e != nil {
		switch {
		case e.done:
			return storage.Result{State: storage.Done, Fingerprint: e.fingerprint, Record: e.record}, nil
		case e.owner == owner:
			e.expires = now.Add(lease)
			return storage.Result{State: storage.Acquired}, nil
		}
		return storage.Result{State: storage.InFlight, Fingerprint: e.fingerprint, LeaseLeft: max(roundUp(e.expires.Sub(now)), time.Millisecond)}, nil
	}
	if len(s.entries) >= s.max && !s.makeRoom(now) {
		return storage.Result{}, fmt.Errorf("memstore: %w: %d entries in flight", storage.ErrFull, len(s.entries))
	}
	e := &entry{key: key, fingerprint: fingerprint, owner: owner, expires: now.Add(lease)}
	s.entries[key] = e
	s.bytes += e.size()
	return storage.Result{State: storage.Acquired}, nil
}

// makeRoom frees one place: an expired entry, else the oldest done one.
func (s *Store) makeRoom(now time.Time) bool {
	// The oldest done entries usually expire first; look there before
	// scanning everything.
	if front := s.done.Front(); front != nil {
		s.remove(front.Value.(*entry))
		return true
	}
	for _, e := range s.entries {
		if !now.Before(e.expires) {
			s.remove(e)
			return true
		}
	}
	return false
}

// Complete implements storage.Store.
func (s *Store) Complete(_ context.Context, key, owner string, record []byte, ttl time.Duration) error {
	if ttl <= 0 {
		return invalid("ttl not positive")
	}
	ttl = roundUp(ttl)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	e := s.live(key, now)
	switch {
	case e == nil:
		return fmt.Errorf("memstore: complete: %w", storage.ErrNotOwner)
	case e.done:
		if bytes.Equal(e.record, record) {
			return nil // a resend of this very completion
		}
		return fmt.Errorf("memstore: complete: %w", storage.ErrNotOwner)
	case e.owner != owner:
		return fmt.Errorf("memstore: complete: %w", storage.ErrNotOwner)
	}
	s.bytes -= e.size()
	e.owner = ""
	e.record = bytes.Clone(record)
	if e.record == nil {
		e.record = []byte{}
	}
	e.done = true
	e.expires = now.Add(ttl)
	e.elem = s.done.PushBack(e)
	s.bytes += e.size()
	return nil
}

// Release implements storage.Store.
func (s *Store) Release(_ context.Context, key, owner string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.live(key, s.now())
	switch {
	case e == nil:
		return nil
	case e.done || e.owner != owner:
		return fmt.Errorf("memstore: release: %w", storage.ErrNotOwner)
	}
	s.remove(e)
	return nil
}

// Extend implements storage.Store.
func (s *Store) Extend(_ context.Context, key, owner string, lease time.Duration) error {
	if lease <= 0 {
		return invalid("lease not positive")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	e := s.live(key, now)
	if e == nil || e.done || e.owner != owner {
		return fmt.Errorf("memstore: extend: %w", storage.ErrNotOwner)
	}
	e.expires = now.Add(roundUp(lease))
	return nil
}
