package idem

import (
	"context"
	"fmt"
	"sync"
)

// work counts the executions in progress, from the lease taken to the
// record stored, background retries included.
type work struct {
	mu    sync.Mutex
	n     int
	idle  chan struct{} // closed when n drops to 0; nil until someone waits
	drain chan struct{} // closed by shutdown; made on first use
}

// add counts one more execution and returns the channel that Shutdown
// closes.
func (w *work) add() <-chan struct{} {
	w.mu.Lock()
	w.n++
	if w.drain == nil {
		w.drain = make(chan struct{})
	}
	d := w.drain
	w.mu.Unlock()
	return d
}

// done counts one execution fewer.
func (w *work) done() {
	w.mu.Lock()
	w.n--
	if w.n == 0 && w.idle != nil {
		close(w.idle)
		w.idle = nil
	}
	w.mu.Unlock()
}

func (w *work) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

// shutdown closes drain and returns a channel closed once no execution is
// left.
func (w *work) shutdown() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.drain == nil {
		w.drain = make(chan struct{})
	}
	select {
	case <-w.drain:
	default:
		close(w.drain)
	}
	if w.n == 0 {
		return closedChan
	}
	if w.idle == nil {
		w.idle = make(chan struct{})
	}
	return w.idle
}

// InFlight returns how many executions the middleware has under way in
// this process: handlers running (a request's, or Do's function) and
// results being stored, background retries included. It is what
// [Middleware.Shutdown] waits for, and a gauge for metrics (idemotel
// reports it).
func (m *Middleware) InFlight() int { return m.work.count() }

// Shutdown waits until every execution the middleware started has ended:
// each handler has returned and its response is stored (or its key
// released), including the background retries that follow a store failure
// (see [WithLease]). It makes those retries try again at once rather than
// at their next backoff step. It returns nil when nothing is left, or,
// when ctx ends first, an error wrapping ctx's error that says how many
// executions were still unfinished: their keys stay locked until their
// leases expire, and a retry after that runs the handler again.
//
// A deploy that stops the process without it can lose the record of a
// handler that has finished: call it after http.Server.Shutdown has
// returned (so no new request arrives and the handlers have returned), and
// before closing the store:
//
//	srv.Shutdown(ctx) // stop accepting, wait for the handlers
//	m.Shutdown(ctx)   // wait for their records to be stored
//	store.Close()
//
// Requests served after Shutdown began are handled as usual, and Shutdown
// waits for them too. It may be called more than once.
func (m *Middleware) Shutdown(ctx context.Context) error {
	idle := m.work.shutdown()
	select {
	case <-idle: // nothing left wins over an ended ctx
		return nil
	default:
	}
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("idem: shutdown: %d executions not finished: %w", m.work.count(), context.Cause(ctx))
	}
}
