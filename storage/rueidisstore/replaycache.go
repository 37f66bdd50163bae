package rueidisstore

import (
	"context"
	"sync"
	"time"

	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/internal/redisproto"
)

// WithReplayCache serves the replays of done keys from rueidis's
// client-side cache, for at most maxAge each: a retry storm on one key
// then costs Redis nothing but the first reads. It needs a client built
// with client-side caching on (rueidis.ClientOption's DisableCache false,
// which [ClientOption] sets true: set it back; CacheSizeEachConn bounds
// the cache's bytes on each connection, 128 MiB by default) and a server
// that speaks RESP3 (Redis 6 and newer, Valkey); maxAge <= 0 leaves it
// off, the default.
//
// Only done entries are served from the cache, never an entry in flight
// or issued: an Acquire reads through the cache only for a key whose
// Acquire found it done before (the last 4,096 such keys; others send
// their SET NX GET as always, so a first execution costs nothing more),
// and takes what it reads only when it is a done entry, sending the SET NX
// GET otherwise. The cache is coherent: Redis tracks the keys each
// connection read (CLIENT TRACKING, opt-in mode) and tells the client
// when one changes, is removed (idemctl rm, the Inspector's Remove) or
// expires, and rueidis drops it; an entry is also never kept past its
// TTL on the server, nor past maxAge, nor once the connection that read
// it is lost. What it cannot close is the moment between a change on the
// server and the client reading the notice: an Acquire in that moment
// replays the record that was just removed. The notice travels from
// Redis to the client as the removal's answer travels to the remover
// (in TestReplayCache, on loopback, it had arrived before the next
// Acquire: no replay followed a removal); on a network, allow the
// one-way delay before retrying a key removed to let it run again.
func WithReplayCache(maxAge time.Duration) Option {
	return func(s *Store) { s.replays.maxAge = maxAge }
}

// replayCache is the store's use of the client-side cache: the keys
// whose Acquire found them done (hot), which an Acquire reads through the
// cache first.
type replayCache struct {
	maxAge time.Duration // 0: off

	mu  sync.Mutex
	hot map[string]struct{} // by the caller's key; at most maxHot
}

// maxHot bounds the keys a store reads through the cache.
const maxHot = 4096

// isHot reports whether key's Acquire found it done before.
func (r *replayCache) isHot(key string) bool {
	if r.maxAge <= 0 {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.hot[key]
	return ok
}

// done records that key's Acquire found it done; when maxHot keys are
// recorded, they are forgotten first.
func (r *replayCache) done(key string) {
	if r.maxAge <= 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.hot == nil || len(r.hot) >= maxHot {
		r.hot = make(map[string]struct{})
	}
	r.hot[key] = struct{}{}
}

// forget stops reading key through the cache: it was not done.
func (r *replayCache) forget(key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.hot, key)
}

// cachedReplay reads key through the client-side cache and returns its
// done entry's result, or ok false (no entry, not a done one, an error:
// the Acquire goes on with its SET NX GET, which answers for it).
func (s *Store) cachedReplay(ctx context.Context, key string) (res storage.Result, ok bool) {
	r := s.c.DoCache(ctx, s.c.B().Get().Key(s.prefix+key).Cache(), s.replays.maxAge)
	v, err := r.ToString()
	if err != nil {
		s.replays.forget(key)
		return storage.Result{}, false
	}
	res, next, err := redisproto.SetResult(v, true, "")
	if err != nil || next != redisproto.Answered || res.State != storage.Done {
		s.replays.forget(key)
		return storage.Result{}, false
	}
	return res, true
}
