package rueidisstore

import (
	"context"
	"time"

	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/internal/redisproto"
	"github.com/redis/rueidis"
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
// GET otherwise (see redisproto.Hot). The cache is coherent: Redis tracks the keys each
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
	return func(s *Store) { s.replayMaxAge = maxAge }
}

// hotReplay reads key, which an Acquire found done lately, with a GET
// (through the client-side cache with WithReplayCache) and returns its
// done entry's result, or ok false (no entry, not a done one, an error:
// the key is forgotten, and the Acquire goes on with its SET NX GET,
// which answers for it).
func (s *Store) hotReplay(ctx context.Context, key string) (res storage.Result, ok bool) {
	var r rueidis.RedisResult
	if s.replayMaxAge > 0 {
		r = s.c.DoCache(ctx, s.c.B().Get().Key(s.prefix+key).Cache(), s.replayMaxAge)
	} else {
		r = s.c.Do(ctx, s.c.B().Get().Key(s.prefix+key).Build())
	}
	v, err := r.ToString()
	if res, ok := redisproto.HotResult(v, err == nil); ok {
		return res, true
	}
	s.hot.Forget(key)
	return storage.Result{}, false
}
