package rueidisstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"

	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/internal/redisproto"
	"github.com/redis/rueidis"
)

var _ storage.Inspector = (*Store)(nil)

// Lookup implements [storage.Inspector.Lookup]: one script, one round
// trip. Since is a time of the clock of the instance that wrote the
// entry (Expires, the server's); it is zero for an entry written by a
// release before the stamp (see redisstore's Layout). Errors wrap [storage.ErrNotFound], or say
// that Redis could not be reached, failed, or holds a value under the key
// that is not an entry.
func (s *Store) Lookup(ctx context.Context, key string, withRecord bool) (storage.Entry, error) {
	mode := redisproto.InspectLookup
	if withRecord {
		mode = redisproto.InspectWithRecord
	}
	return s.inspect(ctx, "lookup", inspect, key, mode)
}

// Remove implements [storage.Inspector.Remove]: one script, one round
// trip, which compares the version and deletes, and which rueidis does
// not resend (a resend would answer ErrNotFound). It is never refused
// for the server's maxmemory-policy. Errors wrap [storage.ErrNotFound],
// [storage.ErrChanged], [storage.ErrInvalid], or say that Redis could not
// be reached, failed, or holds a value under the key that is not an
// entry (which it leaves alone).
func (s *Store) Remove(ctx context.Context, key, version string) (storage.Entry, error) {
	if version == "" {
		return storage.Entry{}, fmt.Errorf("rueidisstore: remove: %w: no version", storage.ErrInvalid)
	}
	return s.inspect(ctx, "remove", remove, key, redisproto.InspectRemove, version)
}

func (s *Store) inspect(ctx context.Context, op string, sc *rueidis.Lua, key, mode string, version ...string) (storage.Entry, error) {
	c := newCall(s.prefix, key, 0)
	defer c.free()
	c.arg(mode)
	for _, v := range version {
		c.arg(v)
	}
	reply, err := c.run(ctx, s.c, sc)
	if err != nil {
		return storage.Entry{}, fmt.Errorf("rueidisstore: %s: %w", op, err)
	}
	e, _, err := redisproto.EntryOf(key, reply, mode == redisproto.InspectWithRecord)
	if err != nil {
		return e, fmt.Errorf("rueidisstore: %s %q: %w", op, c.key(), err)
	}
	return e, nil
}

// List implements [storage.Inspector.List]. Each call costs two round
// trips: one SCAN of about q.Limit keys under the store's prefix, and the
// look-ups of the keys it found, pipelined; keys a SCAN found beyond
// q.Limit wait in the cursor, and the next call looks them up instead of
// scanning. On a Cluster, a call that scans costs one more, a CLUSTER
// SLOTS that names the masters (the command rueidis itself reads the
// Cluster's layout with), and it scans one master at a time, in the
// order of their addresses: a replica would list its master's keys a
// second time. A client of one server scans it; one that knows several
// nodes of the same data (a master and its replicas, through Sentinel or
// a standalone client with replicas) scans the node of the lowest
// address, whichever it is: they hold the same keys, a replica's a little
// late. The entries come in SCAN's order, which is none: a caller sorts
// them. A page holds fewer than q.Limit entries, even none, when SCAN
// found keys that q does not select, or none. Redis's SCAN guarantee
// holds: an entry that lives for the whole listing is listed at least
// once, possibly twice. A cluster whose masters change during a listing
// may be listed incompletely: list again. Values under the prefix that
// are not entries are left out. Errors wrap [storage.ErrInvalid], or say
// that Redis could not be reached or failed.
func (s *Store) List(ctx context.Context, q storage.Query) (storage.Page, error) {
	page, err := redisproto.List(ctx, lister{s}, s.prefix, q)
	if err != nil {
		return storage.Page{}, fmt.Errorf("rueidisstore: list: %w", err)
	}
	return page, nil
}

// lister is the store as [redisproto.List] uses it.
type lister struct{ s *Store }

// LookupAll looks up the entries under the Redis keys keys, in one
// pipeline through the store's client (DoMulti), which routes each key to
// its node. The keys whose node did not have the script cached are looked
// up again with EVAL, in a second pipeline. (rueidis's Lua.ExecMulti would
// load the script on every node first, one more round trip on each call.)
func (l lister) LookupAll(ctx context.Context, keys []string) ([]redisproto.Reply, error) {
	c := l.s.c
	cmds := make(rueidis.Commands, len(keys))
	for i, k := range keys {
		cmds[i] = c.B().Evalsha().Sha1(redisproto.Inspect.SHA).Numkeys(1).Key(k).Arg(redisproto.InspectLookup).Build()
	}
	results := c.DoMulti(ctx, cmds...)
	var again []int // indexes of the keys answered NOSCRIPT
	for i, r := range results {
		if e, ok := rueidis.IsRedisErr(r.Error()); ok && e.IsNoScript() {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		evals := make(rueidis.Commands, len(again))
		for j, i := range again {
			evals[j] = c.B().Eval().Script(redisproto.Inspect.Src).Numkeys(1).Key(keys[i]).Arg(redisproto.InspectLookup).Build()
		}
		for j, r := range c.DoMulti(ctx, evals...) {
			results[again[j]] = r
		}
	}
	out := make([]redisproto.Reply, len(results))
	for i, r := range results {
		reply, err := replyOf(r)
		if err != nil {
			return nil, err
		}
		out[i] = reply
	}
	return out, nil
}

// Nodes returns the servers that List scans: the masters of a Cluster,
// else the node of the lowest address (see [Store.List]).
func (l lister) Nodes(ctx context.Context) ([]redisproto.Node, error) {
	nodes := l.s.c.Nodes()
	addrs := slices.Sorted(maps.Keys(nodes))
	if len(addrs) == 0 {
		return nil, errors.New("the client knows no node")
	}
	if l.s.c.Mode() != rueidis.ClientModeCluster {
		return []redisproto.Node{node(addrs[0], nodes[addrs[0]])}, nil
	}
	var err error
	for _, addr := range addrs { // until one answers
		var masters []redisproto.Node
		if masters, err = clusterMasters(ctx, addr, nodes); err == nil {
			return masters, nil
		}
	}
	return nil, err
}

// clusterMasters asks the node at addr, one of nodes, for the Cluster's
// slots (CLUSTER SLOTS), and returns their masters, each among nodes. An
// address is made as rueidis makes the addresses of nodes from the same
// answer: the host given (the asked node's when it gives none, none when
// it gives "?"), and the port.
func clusterMasters(ctx context.Context, addr string, nodes map[string]rueidis.Client) ([]redisproto.Node, error) {
	n := nodes[addr]
	slots, err := n.Do(ctx, n.B().ClusterSlots().Build()).ToArray()
	if err != nil {
		return nil, fmt.Errorf("CLUSTER SLOTS on %s: %w", addr, err)
	}
	asked, _, _ := net.SplitHostPort(addr)
	var masters []redisproto.Node
	for _, r := range slots {
		v, _ := r.ToArray() // start, end, master, replicas...
		if len(v) < 3 {
			continue
		}
		m, _ := v[2].ToArray() // host, port, id...
		if len(m) < 2 {
			continue
		}
		host, _ := m[0].ToString()
		port, _ := m[1].ToInt64()
		switch host {
		case "?":
			continue
		case "":
			host = asked
		}
		master := net.JoinHostPort(host, strconv.FormatInt(port, 10))
		if slices.ContainsFunc(masters, func(n redisproto.Node) bool { return n.Addr == master }) {
			continue // a master of several ranges
		}
		c, ok := nodes[master]
		if !ok {
			return nil, fmt.Errorf("master %s, named by %s, is not known to the client yet", master, addr)
		}
		masters = append(masters, node(master, c))
	}
	return masters, nil
}

// node is the server c at addr as a listing scans it.
func node(addr string, c rueidis.Client) redisproto.Node {
	return redisproto.Node{Addr: addr, Scan: func(ctx context.Context, cursor uint64, match string, count int64) ([]string, uint64, error) {
		e, err := c.Do(ctx, c.B().Scan().Cursor(cursor).Match(match).Count(count).Build()).AsScanEntry()
		return e.Elements, e.Cursor, err
	}}
}
