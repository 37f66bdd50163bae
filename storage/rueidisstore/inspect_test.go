package rueidisstore_test

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idemkit/idem/internal/redistest"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/rueidisstore"
	"github.com/redis/rueidis"
)

// listAll pages through s's entries with limit, and returns their keys,
// sorted, each once (SCAN may show a key twice).
func listAll(t *testing.T, s *rueidisstore.Store, limit int) []string {
	t.Helper()
	var got []string
	q := storage.Query{Limit: limit}
	for {
		page, err := s.List(t.Context(), q)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range page.Entries {
			got = append(got, e.Key)
		}
		if page.Next == "" {
			break
		}
		q.Cursor = page.Next
	}
	slices.Sort(got)
	return slices.Compact(got)
}

// TestInspectBesideOtherValues: under the store's prefix, values that are
// not entries (garbage, a hash) and entries of a release before the stamp
// sit beside the store's own. Lookup of garbage fails and Remove leaves
// it alone; List leaves them out and still lists every entry, whatever
// its limit; an unstamped entry shows a zero Since, which MinAge leaves
// out. A prefix with glob characters lists its own keys only.
func TestInspectBesideOtherValues(t *testing.T) {
	each(t, func(t *testing.T, c rueidis.Client, _ *miniredis.Miniredis) {
		ctx := t.Context()
		p := prefix("inspect") + "[*?]\\:"
		s := rueidisstore.New(c, rueidisstore.WithPrefix(p))
		other := rueidisstore.New(c, rueidisstore.WithPrefix(strings.TrimSuffix(p, "[*?]\\:")+"x:"))
		if _, err := other.Acquire(ctx, "not-mine", "o", "fp", time.Minute); err != nil {
			t.Fatal(err)
		}
		do(t, c, "SET", p+"garbage", "garbage", "PX", "60000")
		do(t, c, "HSET", p+"hash", "f", "v")
		do(t, c, "PEXPIRE", p+"hash", "60000")
		do(t, c, "SET", p+"old", "D\x02fprecord", "PX", "60000") // an older release's done entry
		want := []string{"a", "b", "c", "d", "e", "old"}
		for _, k := range want[:5] {
			if _, err := s.Acquire(ctx, k, "o", "fp", time.Minute); err != nil {
				t.Fatal(err)
			}
		}

		if _, err := s.Lookup(ctx, "garbage", false); err == nil || errors.Is(err, storage.ErrNotFound) {
			t.Errorf("Lookup of garbage: %v, want an error saying it is not an entry", err)
		}
		if _, err := s.Remove(ctx, "garbage"); err == nil || get(t, c, p+"garbage") != "garbage" {
			t.Errorf("Remove of garbage: %v; want an error, and the value left alone", err)
		}
		if _, err := s.Lookup(ctx, "missing", false); !errors.Is(err, storage.ErrNotFound) {
			t.Errorf("Lookup of a missing key: %v, want ErrNotFound", err)
		}
		old, err := s.Lookup(ctx, "old", true)
		if err != nil || old.State != storage.Done || !old.Since.IsZero() || string(old.Record) != "record" || old.Size != 6 {
			t.Errorf("Lookup of an unstamped done entry: %+v, %v; want done, no Since, its record", old, err)
		}
		for _, limit := range []int{1, 2, 100} {
			if got := listAll(t, s, limit); !slices.Equal(got, want) {
				t.Errorf("List with limit %d: %q, want %q", limit, got, want)
			}
		}
		page, err := s.List(ctx, storage.Query{MinAge: time.Nanosecond, Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range page.Entries {
			if e.Key == "old" {
				t.Errorf("List with a MinAge shows an entry of unknown age: %+v", e)
			}
		}
	})
}

// TestListNoScript: List's pipeline names the Inspect script by its
// digest; on a server that does not have it cached (SCRIPT FLUSH), it
// looks the keys up again with EVAL.
func TestListNoScript(t *testing.T) {
	c := client(t, redistest.Start(t))
	s := rueidisstore.New(c, rueidisstore.WithEvictionAllowed())
	for _, k := range []string{"a", "b", "c"} {
		if _, err := s.Acquire(t.Context(), k, "o", "fp", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	do(t, c, "SCRIPT", "FLUSH")
	if got := listAll(t, s, 10); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("List after SCRIPT FLUSH: %q, want a, b and c", got)
	}
}

// TestListClusterMastersOnly lists on the shared cluster through a client
// that knows one more node than its masters, as a client of a cluster
// with replicas does: a server holding a copy of an entry under the
// prefix, which must not be scanned (the copy would be listed twice).
// CLUSTER SLOTS names the masters; the extra node, which knows no
// cluster, is asked first when its address sorts first, and the next
// node answers.
func TestListClusterMastersOnly(t *testing.T) {
	cluster := client(t, redistest.ClusterAddrs(t)...)
	extraAddr := redistest.Start(t)
	extra := client(t, extraAddr)
	p := prefix("masters")
	nodes := cluster.Nodes()
	nodes[extraAddr] = extra
	c := hooked{Client: cluster, h: newInfoHook(t), nodes: func() map[string]rueidis.Client { return maps.Clone(nodes) }}
	s := rueidisstore.New(c, rueidisstore.WithPrefix(p))
	want := []string{"a", "b", "c", "d", "e", "f", "g", "h"} // on every master
	for _, k := range want {
		if _, err := s.Acquire(t.Context(), k, "o", "fp", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	onExtra := rueidisstore.New(extra, rueidisstore.WithPrefix(p), rueidisstore.WithEvictionAllowed())
	if _, err := onExtra.Acquire(t.Context(), "a", "o", "fp", time.Minute); err != nil {
		t.Fatal(err)
	}
	counter := newServerCounter(t, extraAddr)
	for _, limit := range []int{1, 3, 100} {
		if got := listAll(t, s, limit); !slices.Equal(got, want) {
			t.Errorf("List with limit %d: %q, want %q", limit, got, want)
		}
	}
	if got, _ := counter.count(); got["scan"] != 0 {
		t.Errorf("the node that is no master was scanned: %v", got)
	}
}
