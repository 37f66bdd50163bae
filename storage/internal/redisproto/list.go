package redisproto

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idemkit/idem/storage"
)

// Node is a server a listing scans: a master of a cluster, a shard of a
// ring, or the one server.
type Node struct {
	Addr string
	// Scan sends SCAN cursor MATCH match COUNT count to the node.
	Scan func(ctx context.Context, cursor uint64, match string, count int64) (keys []string, next uint64, err error)
}

// Lister is what a listing needs of a transport.
type Lister interface {
	// Nodes returns the servers to scan, in any order.
	Nodes(ctx context.Context) ([]Node, error)
	// LookupAll runs the Inspect script with [InspectLookup] on each of
	// the Redis keys (the prefix included), pipelined, and returns the
	// replies in order. It fails when one of them could not be run.
	LookupAll(ctx context.Context, keys []string) ([]Reply, error)
}

// List implements [storage.Inspector.List] over a transport: one SCAN of
// about q.Limit keys under prefix on one node (the nodes taken in the
// order of their addresses), then the look-ups of the keys it found,
// pipelined; keys a SCAN found beyond q.Limit wait in the cursor, and the
// next call looks them up instead of scanning. Values under the prefix
// that are not entries, and keys gone since SCAN saw them, are left out.
// Errors wrap [storage.ErrInvalid], or are the transport's.
func List(ctx context.Context, t Lister, prefix string, q storage.Query) (storage.Page, error) {
	q, err := storage.CheckQuery(q)
	if err != nil {
		return storage.Page{}, err
	}
	cur, err := ParseCursor(q.Cursor)
	if err != nil {
		return storage.Page{}, err
	}
	if len(cur.Keys) == 0 {
		if cur, err = scan(ctx, t, prefix, cur, q.Cursor == "", q.Limit); err != nil {
			return storage.Page{}, err
		}
	}
	n := min(len(cur.Keys), q.Limit)
	var page storage.Page
	if n > 0 {
		keys := cur.Keys[:n]
		replies, err := t.LookupAll(ctx, keys)
		if err != nil {
			return storage.Page{}, err
		}
		for i, r := range replies {
			e, now, err := EntryOf(strings.TrimPrefix(keys[i], prefix), r, false)
			if err != nil {
				continue // gone since SCAN saw it, or not an entry
			}
			if selected(q, e, now) {
				page.Entries = append(page.Entries, e)
			}
		}
	}
	cur.Keys = cur.Keys[n:]
	if len(cur.Keys) > 0 || cur.Node != "" {
		page.Next = cur.String()
	}
	return page, nil
}

// selected reports whether q selects e, looked up at the server's time
// now.
func selected(q storage.Query, e storage.Entry, now time.Time) bool {
	return (q.State == 0 || e.State == q.State) &&
		(q.MinAge == 0 || (!e.Since.IsZero() && now.Sub(e.Since) >= q.MinAge))
}

// scan runs the SCAN that cur points at (the first one when start is
// set), and returns the cursor after it, holding the keys it found. Once
// a node's SCAN is over, the cursor points at the start of the next
// node; after the last one, at no node (the keys it holds are the last).
// A node gone since the cursor was made is skipped.
func scan(ctx context.Context, t Lister, prefix string, cur Cursor, start bool, count int) (Cursor, error) {
	nodes, err := t.Nodes(ctx)
	if err != nil {
		return Cursor{}, err
	}
	slices.SortFunc(nodes, func(a, b Node) int { return strings.Compare(a.Addr, b.Addr) })
	i := 0
	if !start {
		var found bool
		i, found = slices.BinarySearchFunc(nodes, cur.Node, func(n Node, addr string) int { return strings.Compare(n.Addr, addr) })
		if !found {
			cur.Scan = 0 // the node after it, from its start
		}
		if i == len(nodes) {
			return Cursor{}, nil
		}
	}
	keys, next, err := nodes[i].Scan(ctx, cur.Scan, Match(prefix), int64(count))
	if err != nil {
		return Cursor{}, fmt.Errorf("SCAN on %s: %w", nodes[i].Addr, err)
	}
	cur = Cursor{Node: nodes[i].Addr, Scan: next, Keys: keys}
	if next == 0 {
		cur.Node = ""
		if i+1 < len(nodes) {
			cur.Node = nodes[i+1].Addr
		}
	}
	return cur, nil
}
