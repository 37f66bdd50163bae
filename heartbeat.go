package idem

import (
	"context"
	"errors"
	"hash/maphash"
	"math/rand/v2"
	"runtime"
	"sync"
	"time"

	"github.com/idemkit/idem/storage"
)

// beats renews the leases of the handlers that run for longer than
// lease/3, every lease/3, with one timer per queue: a handler that
// finishes sooner costs no timer, goroutine or allocation. A queue is in
// order of due time, since every entry is due the same period after it was
// queued. Executions are spread over several queues, each behind a lock of
// its own, by a hash of their storage key, so that handlers starting and
// finishing on many cores seldom wait for each other (issue 28: on 16
// cores, one queue's lock was a fifth of the lock waiting left once the
// memory store was sharded).
//
// A renewal that fails (the store is unreachable, or slow) is tried again
// soon, not a period later, with a timer of its own: after a jittered
// backoff from lease/100 doubling to lease/20, and never later than a
// third of the time the lease has left since the last renewal that
// succeeded, so the tries grow denser as the lease nears its end. They go
// on until one succeeds (the beat is queued again for a period), the
// store answers ErrNotOwner, the handler finishes, or the lease has run
// out since the last success. So a store outage that ends before the
// lease does, that is shorter than two thirds of the lease when it begins
// as a renewal falls due, costs no second execution.
type beats struct {
	m      *Middleware
	every  time.Duration
	seed   maphash.Seed
	queues []beatQueue // a power of two of them
}

// beatQueue is one queue of beats, with its lock and its timer.
type beatQueue struct {
	s          *beats
	mu         sync.Mutex
	t          *time.Timer // armed while armed is true
	armed      bool
	head, tail *beat    // waiting, soonest due first
	_          [64]byte // no false sharing with the next queue
}

// maxBeatQueues bounds the number of heartbeat queues: 4 a P (GOMAXPROCS
// at New), rounded up to a power of two.
const maxBeatQueues = 64 // fits beat.q

// beat is one handler's place in the heartbeat queue.
type beat struct {
	ctx         context.Context // the request's (or Do's), for its values
	skey, owner string
	due         time.Time
	ok          time.Time // when the last renewal (or the acquire) was sent
	fails       int       // failed renewals since ok
	retry       *time.Timer
	prev, next  *beat
	queued      bool
	stopped     bool
	q           uint8          // its queue's index in beats.queues (in padding: no larger execution)
	renewing    sync.WaitGroup // a renewal in progress, or a retry set
}

func (s *beats) init(m *Middleware) {
	s.m, s.every, s.seed = m, m.cfg.lease/3, maphash.MakeSeed()
	n := 1
	for n < 4*runtime.GOMAXPROCS(0) && n < maxBeatQueues {
		n <<= 1
	}
	s.queues = make([]beatQueue, n)
	for i := range s.queues {
		q := &s.queues[i]
		q.s = s
		q.t = time.AfterFunc(time.Hour, q.fire)
		q.t.Stop()
	}
}

// start queues b: its lease is renewed every lease/3 until stop. ctx is
// the execution's: the renewals keep its values, not its cancellation.
func (s *beats) start(b *beat, ctx context.Context, skey, owner string) {
	b.ctx, b.skey, b.owner = ctx, skey, owner
	if len(s.queues) > 1 {
		b.q = uint8(maphash.String(s.seed, skey) & uint64(len(s.queues)-1))
	}
	q := &s.queues[b.q]
	q.mu.Lock()
	b.ok = time.Now()
	q.push(b)
	q.mu.Unlock()
}

// stop ends b's renewals and waits for one in progress, so that no renewal
// happens after the handler finished.
func (s *beats) stop(b *beat) {
	q := &s.queues[b.q]
	q.mu.Lock()
	b.stopped = true
	if b.queued {
		q.unlink(b)
	}
	if b.retry != nil && b.retry.Stop() {
		b.renewing.Done() // the retry that will not run
	}
	q.mu.Unlock()
	b.renewing.Wait()
}

// push queues b, due one period from now. q.mu is held.
func (q *beatQueue) push(b *beat) {
	b.due = time.Now().Add(q.s.every)
	b.prev, b.next, b.queued = q.tail, nil, true
	if q.tail != nil {
		q.tail.next = b
	} else {
		q.head = b
	}
	q.tail = b
	if !q.armed {
		q.armed = true
		q.t.Reset(q.s.every)
	}
}

// unlink takes b out of the queue. q.mu is held.
func (q *beatQueue) unlink(b *beat) {
	if b.prev != nil {
		b.prev.next = b.next
	} else {
		q.head = b.next
	}
	if b.next != nil {
		b.next.prev = b.prev
	} else {
		q.tail = b.prev
	}
	b.prev, b.next, b.queued = nil, nil, false
}

// fire starts the renewals of q that are due and arms its timer for the
// next.
func (q *beatQueue) fire() {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := time.Now()
	for b := q.head; b != nil && !b.due.After(now); b = q.head {
		q.unlink(b)
		b.renewing.Add(1)
		go q.s.renew(b)
	}
	if q.head == nil {
		q.armed = false
		return
	}
	q.t.Reset(q.head.due.Sub(now))
}

// renew extends b's lease once. On success it queues b again for the next
// period; on a failure it sets b's retry (see beats), unless the handler
// finished meanwhile or the lease was lost (the finish will see it and
// tell the observer). Each try lasts at most a period, and never past the
// end of the lease as the last success left it.
func (s *beats) renew(b *beat) {
	defer b.renewing.Done()
	lease, q := s.m.cfg.lease, &s.queues[b.q]
	q.mu.Lock()
	stopped, ok := b.stopped, b.ok
	q.mu.Unlock()
	if stopped {
		return
	}
	sent := time.Now()
	end := ok.Add(lease) // the lease's end, as far as is known
	deadline := sent.Add(s.every)
	if end.Before(deadline) {
		deadline = end
	}
	ctx, cancel := context.WithDeadline(context.WithoutCancel(b.ctx), deadline)
	err := s.m.store.Extend(ctx, b.skey, b.owner, lease)
	cancel()
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case b.stopped || errors.Is(err, storage.ErrNotOwner):
	case err == nil:
		b.ok, b.fails = sent, 0
		q.push(b)
	default:
		left := time.Until(end)
		if left <= 0 {
			return // lost, unless the store's clock is kind: the finish finds out
		}
		b.fails++
		b.renewing.Add(1)
		b.retry = time.AfterFunc(retryDelay(lease, b.fails, left), func() { s.renew(b) })
	}
}

// retryDelay is the wait before the fails-th try of a failed renewal,
// left being the time until the lease ends: a jittered backoff from
// lease/100 doubling to lease/20, at most a third of left.
func retryDelay(lease time.Duration, fails int, left time.Duration) time.Duration {
	d := lease / 100
	for i := 1; i < fails && d < lease/20; i++ {
		d *= 2
	}
	d = min(d, lease/20)
	d = d/2 + rand.N(d/2+1) // jitter: between half of it and all of it
	return max(min(d, left/3), time.Millisecond)
}
