package redisstore_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/redis/go-redis/v9"
)

// TestInspectBesideOtherValues: under the store's prefix, values that are
// not entries (garbage, a hash) and entries of a release before the stamp
// sit beside the store's own. Lookup of garbage fails and Remove leaves
// it alone; List leaves them out and still lists every entry, whatever
// its limit; an unstamped entry shows a zero Since, which MinAge leaves
// out. A prefix with glob characters lists its own keys only.
func TestInspectBesideOtherValues(t *testing.T) {
	each(t, func(t *testing.T, rdb *redis.Client, _ *miniredis.Miniredis) {
		ctx := t.Context()
		p := prefix("inspect") + "[*?]\\:"
		s := redisstore.New(rdb, redisstore.WithPrefix(p))
		other := redisstore.New(rdb, redisstore.WithPrefix(strings.TrimSuffix(p, "[*?]\\:")+"x:"))
		if _, err := other.Acquire(ctx, "not-mine", "o", "fp", time.Minute); err != nil {
			t.Fatal(err)
		}
		must(t, rdb.Set(ctx, p+"garbage", "garbage", time.Minute).Err())
		must(t, rdb.HSet(ctx, p+"hash", "f", "v").Err())
		must(t, rdb.Expire(ctx, p+"hash", time.Minute).Err())
		must(t, rdb.Set(ctx, p+"old", "D\x02fprecord", time.Minute).Err()) // an older release's done entry
		want := []string{"a", "b", "c", "d", "e", "old"}
		for _, k := range want[:5] {
			if _, err := s.Acquire(ctx, k, "o", "fp", time.Minute); err != nil {
				t.Fatal(err)
			}
		}

		if _, err := s.Lookup(ctx, "garbage", false); err == nil || errors.Is(err, storage.ErrNotFound) {
			t.Errorf("Lookup of garbage: %v, want an error saying it is not an entry", err)
		}
		if _, err := s.Remove(ctx, "garbage"); err == nil || rdb.Get(ctx, p+"garbage").Val() != "garbage" {
			t.Errorf("Remove of garbage: %v; want an error, and the value left alone", err)
		}
		old, err := s.Lookup(ctx, "old", true)
		if err != nil || old.State != storage.Done || !old.Since.IsZero() || string(old.Record) != "record" || old.Size != 6 {
			t.Errorf("Lookup of an unstamped done entry: %+v, %v; want done, no Since, its record", old, err)
		}
		for _, limit := range []int{1, 2, 100} {
			var got []string
			q := storage.Query{Limit: limit}
			for {
				page, err := s.List(ctx, q)
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
			got = slices.Compact(got) // SCAN may show a key twice
			if !slices.Equal(got, want) {
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

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
