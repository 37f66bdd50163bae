package idem

import "sync"

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
