package idem

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/idemkit/idem/storage"
)

// beats renews the leases of the handlers that run for longer than
// lease/3, every lease/3, with one timer for the whole Middleware: a
// handler that finishes sooner costs no timer, goroutine or allocation.
// The queue is in order of due time, since every entry is due the same
// period after it was queued.
type beats struct {
	m     *Middleware
	every time.Duration

	mu         sync.Mutex
	t          *time.Timer // armed while armed is true
	armed      bool
	head, tail *beat // waiting, soonest due first
}

// beat is one handler's place in the heartbeat queue.
type beat struct {
	skey, owner string
	due         time.Time
	prev, next  *beat
	queued      bool
	stopped     bool
	renewing    sync.WaitGroup // a renewal in progress
}

func (s *beats) init(m *Middleware) {
	s.m, s.every = m, m.cfg.lease/3
	s.t = time.AfterFunc(time.Hour, s.fire)
	s.t.Stop()
}

// start queues b: its lease is renewed every lease/3 until stop.
func (s *beats) start(b *beat, skey, owner string) {
	b.skey, b.owner = skey, owner
	s.mu.Lock()
	s.push(b)
	s.mu.Unlock()
}

// stop ends b's renewals and waits for one in progress, so that no renewal
// happens after the handler finished.
func (s *beats) stop(b *beat) {
	s.mu.Lock()
	b.stopped = true
	if b.queued {
		s.unlink(b)
	}
	s.mu.Unlock()
	b.renewing.Wait()
}

// push queues b, due one period from now. s.mu is held.
func (s *beats) push(b *beat) {
	b.due = time.Now().Add(s.every)
	b.prev, b.next, b.queued = s.tail, nil, true
	if s.tail != nil {
		s.tail.next = b
	} else {
		s.head = b
	}
	s.tail = b
	if !s.armed {
		s.armed = true
		s.t.Reset(s.every)
	}
}

// unlink takes b out of the queue. s.mu is held.
func (s *beats) unlink(b *beat) {
	if b.prev != nil {
		b.prev.next = b.next
	} else {
		s.head = b.next
	}
	if b.next != nil {
		b.next.prev = b.prev
	} else {
		s.tail = b.prev
	}
	b.prev, b.next, b.queued = nil, nil, false
}

// fire starts the renewals that are due and arms the timer for the next.
func (s *beats) fire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for b := s.head; b != nil && !b.due.After(now); b = s.head {
		s.unlink(b)
		b.renewing.Add(1)
		go s.renew(b)
	}
	if s.head == nil {
		s.armed = false
		return
	}
	s.t.Reset(s.head.due.Sub(now))
}

// renew extends b's lease once and queues it again, unless the handler
// finished meanwhile or the lease was lost (the finish will see it and
// tell the observer).
func (s *beats) renew(b *beat) {
	defer b.renewing.Done()
	ctx, cancel := context.WithTimeout(context.Background(), s.every)
	err := s.m.store.Extend(ctx, b.skey, b.owner, s.m.cfg.lease)
	cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !b.stopped && !errors.Is(err, storage.ErrNotOwner) {
		s.push(b)
	}
}
