package redisstore

import (
	"cmp"
	"context"
	"fmt"
	"sync"

	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/internal/redisproto"
	"github.com/redis/go-redis/v9"
)

var _ storage.Inspector = (*Store)(nil)

// Lookup implements [storage.Inspector.Lookup]: one script, one round
// trip. Since is a time of the clock of the instance that wrote the
// entry (Expires, the server's); it is zero for an entry written by a
// release before the stamp (see Layout in the package documentation). Errors wrap
// [storage.ErrNotFound], or say that Redis could not be reached, failed,
// or holds a value under the key that is not an entry.
func (s *Store) Lookup(ctx context.Context, key string, withRecord bool) (storage.Entry, error) {
	mode := redisproto.InspectLookup
	if withRecord {
		mode = redisproto.InspectWithRecord
	}
	return s.inspect(ctx, "lookup", key, mode)
}

// Remove implements [storage.Inspector.Remove]: one script, one round
// trip, which compares the version and deletes. It is never refused for
// the server's maxmemory-policy. Errors wrap [storage.ErrNotFound],
// [storage.ErrChanged], [storage.ErrInvalid], or say that Redis could not
// be reached, failed, or holds a value under the key that is not an
// entry (which it leaves alone).
func (s *Store) Remove(ctx context.Context, key, version string) (storage.Entry, error) {
	if version == "" {
		return storage.Entry{}, fmt.Errorf("redisstore: remove: %w: no version", storage.ErrInvalid)
	}
	return s.inspect(ctx, "remove", key, redisproto.InspectRemove, version)
}

func (s *Store) inspect(ctx context.Context, op, key, mode string, version ...any) (storage.Entry, error) {
	c := &call{key: s.prefix + key}
	reply, err := s.run(ctx, inspect, c, append([]any{mode}, version...)...)
	if err != nil {
		return storage.Entry{}, fmt.Errorf("redisstore: %s: %w", op, err)
	}
	e, _, err := redisproto.EntryOf(key, reply, mode == redisproto.InspectWithRecord)
	if err != nil {
		return e, fmt.Errorf("redisstore: %s %q: %w", op, c.key, err)
	}
	return e, nil
}

// List implements [storage.Inspector.List]. Each call costs two round
// trips: one SCAN of about q.Limit keys under the store's prefix (on one
// master of a redis.ClusterClient, or one shard of a redis.Ring, taken in
// the order of their addresses), and the look-ups of the keys it found,
// pipelined; keys a SCAN found beyond q.Limit wait in the cursor, and the
// next call looks them up instead of scanning. The entries come in
// SCAN's order, which is none: a caller sorts them. A page holds fewer
// than q.Limit entries, even none, when SCAN found keys that q does not
// select, or none. Redis's SCAN guarantee holds: an entry that lives for
// the whole listing is listed at least once, possibly twice. A cluster
// whose masters change during a listing may be listed incompletely: list
// again. Values under the prefix that are not entries are left out.
// Errors wrap [storage.ErrInvalid], or say that Redis could not be
// reached or failed.
func (s *Store) List(ctx context.Context, q storage.Query) (storage.Page, error) {
	page, err := redisproto.List(ctx, lister{s}, s.prefix, q)
	if err != nil {
		return storage.Page{}, fmt.Errorf("redisstore: list: %w", err)
	}
	return page, nil
}

// lister is the store as [redisproto.List] uses it.
type lister struct{ s *Store }

// LookupAll looks up the entries under the Redis keys keys, in one
// pipeline through the store's client, which routes each key to its node.
func (l lister) LookupAll(ctx context.Context, keys []string) ([]redisproto.Reply, error) {
	cmds, _ := l.s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range keys {
			inspect.EvalSha(ctx, p, []string{k}, redisproto.InspectLookup)
		}
		return nil
	})
	out := make([]redisproto.Reply, len(cmds))
	for i, cmd := range cmds {
		reply, err := cmd.(*redis.Cmd).Result()
		if noScript(err) {
			reply, err = inspect.Eval(ctx, l.s.rdb, []string{keys[i]}, redisproto.InspectLookup).Result()
		}
		if err != nil {
			return nil, err
		}
		out[i] = redisproto.FromAny(reply)
	}
	return out, nil
}

// Nodes returns the servers that List scans: each master of a
// ClusterClient, each shard of a Ring, or the store's client.
func (l lister) Nodes(ctx context.Context) ([]redisproto.Node, error) {
	var (
		mu    sync.Mutex
		nodes []redisproto.Node
	)
	add := func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		nodes = append(nodes, node(c.Options().Addr, c))
		return nil
	}
	var err error
	switch c := l.s.rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, add)
	case *redis.Ring:
		err = c.ForEachShard(ctx, add)
	case *redis.Client:
		nodes = []redisproto.Node{node(cmp.Or(c.Options().Addr, "server"), c)}
	default:
		nodes = []redisproto.Node{node("server", l.s.rdb)}
	}
	if err != nil {
		return nil, err
	}
	return nodes, nil
}

// node is the server c as a listing scans it.
func node(addr string, c redis.Cmdable) redisproto.Node {
	return redisproto.Node{Addr: addr, Scan: func(ctx context.Context, cursor uint64, match string, count int64) ([]string, uint64, error) {
		return c.Scan(ctx, cursor, match, count).Result()
	}}
}
