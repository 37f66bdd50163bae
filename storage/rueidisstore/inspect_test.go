package rueidisstore_test

import (
	"maps"
	"slices"
	"testing"
	"time"

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
