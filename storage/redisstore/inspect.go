package redisstore

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem/storage"
	"github.com/redis/go-redis/v9"
)

var _ storage.Inspector = (*Store)(nil)

// inspectSrc: ARGV[1] "0" (look up), "1" (look up with the record) or
// "2" (remove). No entry: 0; not an entry: -1; otherwise {state,
// fingerprint, since, pttl, the server's seconds, microseconds, the
// record's size, the record or ""}, and for "2" the key is deleted.
//
// It reads the value with PCALL, so that a key of another type is "not an
// entry" (-1) rather than an error: List meets them under an empty
// prefix.
var inspectSrc = strings.Replace(parseLua, "local v = redis.call('GET', KEYS[1])",
	"local v = redis.pcall('GET', KEYS[1])\nif type(v) == 'table' and v.err then return -1 end", 1) + `
if not v then return 0 end
local tag, fp, rest, t, o, since = parse(v)
if not tag then return -1 end
local now = redis.call('TIME')
local size, rec = 0, ''
if tag == 'D' then
  size = #rest
  if ARGV[1] == '1' then rec = rest end
end
local pttl = redis.call('PTTL', KEYS[1])
if ARGV[1] == '2' then redis.call('DEL', KEYS[1]) end
return {tag, fp, since or '', pttl, now[1], now[2], size, rec}
`

var inspect = newScript(inspectSrc)

// The modes of the inspect script.
const (
	inspectLookup     = "0"
	inspectWithRecord = "1"
	inspectRemove     = "2"
)

// Lookup implements [storage.Inspector.Lookup]: one script, one round
// trip. Since is zero for an entry written by a release before the stamp
// (see Layout in the package documentation). Errors wrap
// [storage.ErrNotFound], or say that Redis could not be reached, failed,
// or holds a value under the key that is not an entry.
func (s *Store) Lookup(ctx context.Context, key string, withRecord bool) (storage.Entry, error) {
	mode := inspectLookup
	if withRecord {
		mode = inspectWithRecord
	}
	return s.inspect(ctx, "lookup", key, mode)
}

// Remove implements [storage.Inspector.Remove]: one script, one round
// trip. It is never refused for the server's maxmemory-policy. Errors
// wrap [storage.ErrNotFound], or say that Redis could not be reached,
// failed, or holds a value under the key that is not an entry (which it
// leaves alone).
func (s *Store) Remove(ctx context.Context, key string) (storage.Entry, error) {
	return s.inspect(ctx, "remove", key, inspectRemove)
}

func (s *Store) inspect(ctx context.Context, op, key, mode string) (storage.Entry, error) {
	c := &call{key: s.prefix + key}
	reply, err := s.run(ctx, inspect, c, mode)
	if err != nil {
		return storage.Entry{}, fmt.Errorf("redisstore: %s: %w", op, replyErr(err))
	}
	e, _, err := entryOf(key, reply, mode == inspectWithRecord)
	if err != nil {
		return storage.Entry{}, fmt.Errorf("redisstore: %s %q: %w", op, c.key, err)
	}
	return e, nil
}

// entryOf maps the inspect script's answer for key, and returns the
// server's time when it answered.
func entryOf(key string, reply any, withRecord bool) (storage.Entry, time.Time, error) {
	switch v := reply.(type) {
	case int64:
		switch v {
		case 0:
			return storage.Entry{}, time.Time{}, storage.ErrNotFound
		case codeCorrupt:
			return storage.Entry{}, time.Time{}, errCorrupt
		}
	case []any:
		if len(v) != 8 {
			break
		}
		tag, ok0 := v[0].(string)
		fp, ok1 := v[1].(string)
		since, ok2 := v[2].(string)
		pttl, ok3 := v[3].(int64)
		sec, ok4 := v[4].(string)
		usec, ok5 := v[5].(string)
		size, ok6 := v[6].(int64)
		rec, ok7 := v[7].(string)
		if !(ok0 && ok1 && ok2 && ok3 && ok4 && ok5 && ok6 && ok7) {
			break
		}
		secs, err1 := strconv.ParseInt(sec, 10, 64)
		usecs, err2 := strconv.ParseInt(usec, 10, 64)
		if err1 != nil || err2 != nil || (since != "" && len(since) != 6) {
			break
		}
		now := time.Unix(secs, usecs*1000)
		e := storage.Entry{Key: key, Fingerprint: fp, Since: stampTime(since)}
		if pttl >= 0 { // every entry has a TTL; -1 would be a key without one
			e.Expires = now.Add(time.Duration(pttl) * time.Millisecond)
		}
		switch tag {
		case "P":
			e.State, e.LeaseLeft = storage.InFlight, time.Duration(max(pttl, 0))*time.Millisecond
		case "D":
			e.State, e.Size = storage.Done, int(size)
			if withRecord {
				e.Record = []byte(rec)
			}
		case "I":
			e.State = storage.Issued
		default:
			return storage.Entry{}, time.Time{}, unexpected(reply)
		}
		return e, now, nil
	}
	return storage.Entry{}, time.Time{}, unexpected(reply)
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
	q, err := storage.CheckQuery(q)
	if err != nil {
		return storage.Page{}, fmt.Errorf("redisstore: list: %w", err)
	}
	cur, err := parseCursor(q.Cursor)
	if err != nil {
		return storage.Page{}, fmt.Errorf("redisstore: list: %w", err)
	}
	if len(cur.Keys) == 0 {
		if cur, err = s.scan(ctx, cur, q.Cursor == "", q.Limit); err != nil {
			return storage.Page{}, fmt.Errorf("redisstore: list: %w", err)
		}
	}
	n := min(len(cur.Keys), q.Limit)
	found, err := s.lookupAll(ctx, cur.Keys[:n])
	if err != nil {
		return storage.Page{}, fmt.Errorf("redisstore: list: %w", err)
	}
	cur.Keys = cur.Keys[n:]
	var page storage.Page
	for _, f := range found {
		if (q.State == 0 || f.State == q.State) && (q.MinAge == 0 || (!f.Since.IsZero() && f.now.Sub(f.Since) >= q.MinAge)) {
			page.Entries = append(page.Entries, f.Entry)
		}
	}
	if len(cur.Keys) > 0 || cur.Node != "" {
		page.Next = cur.String()
	}
	return page, nil
}

// scan runs the SCAN that cur points at (the first one when start is
// set), and returns the cursor after it, holding the keys it found. Once
// a node's SCAN is over, the cursor points at the start of the next
// node; after the last one, at no node (the keys it holds are the last).
// A node gone since the cursor was made is skipped.
func (s *Store) scan(ctx context.Context, cur cursor, start bool, count int) (cursor, error) {
	nodes, err := s.nodes(ctx)
	if err != nil {
		return cursor{}, err
	}
	i := 0
	if !start {
		var found bool
		i, found = slices.BinarySearchFunc(nodes, cur.Node, func(n node, addr string) int { return strings.Compare(n.addr, addr) })
		if !found {
			cur.Scan = 0 // the node after it, from its start
		}
		if i == len(nodes) {
			return cursor{}, nil
		}
	}
	keys, next, err := nodes[i].Scan(ctx, cur.Scan, globEscape(s.prefix)+"*", int64(count)).Result()
	if err != nil {
		return cursor{}, fmt.Errorf("SCAN on %s: %w", nodes[i].addr, err)
	}
	cur = cursor{Node: nodes[i].addr, Scan: next, Keys: keys}
	if next == 0 {
		cur.Node = ""
		if i+1 < len(nodes) {
			cur.Node = nodes[i+1].addr
		}
	}
	return cur, nil
}

// listed is an entry as List found it, with the server's time then.
type listed struct {
	storage.Entry
	now time.Time
}

// lookupAll looks up the entries under the Redis keys keys, in one
// pipeline (through the store's client, which routes each key to its
// node), leaving out the keys that hold no entry now (expired or removed
// since SCAN saw them) and the values that are not entries.
func (s *Store) lookupAll(ctx context.Context, keys []string) ([]listed, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	cmds, _ := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range keys {
			inspect.EvalSha(ctx, p, []string{k}, inspectLookup)
		}
		return nil
	})
	var out []listed
	for i, cmd := range cmds {
		reply, err := cmd.(*redis.Cmd).Result()
		if err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT")) {
			reply, err = inspect.Eval(ctx, s.rdb, []string{keys[i]}, inspectLookup).Result()
		}
		if err != nil {
			return nil, err
		}
		e, now, err := entryOf(strings.TrimPrefix(keys[i], s.prefix), reply, false)
		if err != nil {
			continue // gone since SCAN saw it, or not an entry
		}
		out = append(out, listed{e, now})
	}
	return out, nil
}

// node is a server that List scans: the store's client, one master of a
// cluster, or one shard of a ring.
type node struct {
	addr string
	redis.Cmdable
}

// nodes returns the servers that List scans, by address.
func (s *Store) nodes(ctx context.Context) ([]node, error) {
	var (
		mu    sync.Mutex
		nodes []node
	)
	add := func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		nodes = append(nodes, node{c.Options().Addr, c})
		return nil
	}
	var err error
	switch c := s.rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, add)
	case *redis.Ring:
		err = c.ForEachShard(ctx, add)
	case *redis.Client:
		nodes = []node{{cmp.Or(c.Options().Addr, "server"), c}}
	default:
		nodes = []node{{"server", s.rdb}}
	}
	if err != nil {
		return nil, err
	}
	slices.SortFunc(nodes, func(a, b node) int { return strings.Compare(a.addr, b.addr) })
	return nodes, nil
}

// cursor is where a listing goes on: the keys that an earlier SCAN found
// and no page has shown yet, then the SCAN cursor on the node of that
// address (none: the listing ends with the keys). Its text is base64url
// of its JSON.
type cursor struct {
	Node string   `json:"n"`
	Scan uint64   `json:"c,omitempty"`
	Keys []string `json:"k,omitempty"`
}

func (c cursor) String() string {
	b, _ := json.Marshal(c) // cannot fail
	return base64.RawURLEncoding.EncodeToString(b)
}

// parseCursor reads a Page.Next that List made; "" is the start.
func parseCursor(s string) (cursor, error) {
	var c cursor
	if s == "" {
		return c, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil {
		err = json.Unmarshal(b, &c)
	}
	if err != nil || (c.Node == "" && len(c.Keys) == 0) {
		return cursor{}, fmt.Errorf("%w: cursor %q was not made by this store", storage.ErrInvalid, s)
	}
	return c, nil
}

// globEscape escapes the characters that SCAN's MATCH pattern gives a
// meaning to.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
