package redisproto

import (
	"sync"
	"sync/atomic"

	"github.com/idemkit/idem/storage"
)

// MaxHot bounds the keys a [Hot] holds; past it, it starts afresh.
const MaxHot = 4096

// Hot is the keys whose Acquire found them done lately, which a store's
// next Acquire of them reads first with a GET (or rueidis's client-side
// cache): a done entry read there is the Acquire's answer, as the SET NX
// GET's would be, at the cost of a GET, the naive floor of a replay; a
// retry storm on one key (a provider's callback resent every second, a
// client in a loop) costs Redis its GETs. Anything else read there (no
// entry, one in flight or issued, an error) forgets the key, and the
// Acquire goes on with its SET NX GET: one round trip more, once, for a
// key done and then removed or expired. Its zero value is ready; it is
// safe for concurrent use, and a look-up takes no lock.
type Hot struct {
	keys sync.Map // the caller's key (without the store's prefix) -> struct{}
	n    atomic.Int64
}

// Has reports whether key's Acquire found it done lately.
func (h *Hot) Has(key string) bool {
	_, ok := h.keys.Load(key)
	return ok
}

// Add records that key's Acquire found it done.
func (h *Hot) Add(key string) {
	if h.n.Load() >= MaxHot {
		h.keys.Clear()
		h.n.Store(0)
	}
	if _, loaded := h.keys.LoadOrStore(key, struct{}{}); !loaded {
		h.n.Add(1)
	}
}

// Forget forgets key: it was not done when read.
func (h *Hot) Forget(key string) {
	if _, loaded := h.keys.LoadAndDelete(key); loaded {
		h.n.Add(-1)
	}
}

// HotResult reads v, the value a GET of a hot key answered (found false:
// no value), as the Acquire's answer: ok only for a done entry.
func HotResult(v string, found bool) (res storage.Result, ok bool) {
	if !found {
		return storage.Result{}, false
	}
	r, next, err := SetResult(v, true, "")
	if err != nil || next != Answered || r.State != storage.Done {
		return storage.Result{}, false
	}
	return r, true
}
