package redisx_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func TestClusterAddrsIsSharedAndServesEverySlot(t *testing.T) {
	addrs := redistest.ClusterAddrs(t)
	if len(addrs) != redistest.ClusterMasters {
		t.Fatalf("%d addresses, want %d", len(addrs), redistest.ClusterMasters)
	}
	if again := redistest.ClusterAddrs(t); again[0] != addrs[0] {
		t.Fatalf("second ClusterAddrs %q, first %q: want one cluster per test binary", again, addrs)
	}
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { rdb.Close() })
	var masters atomic.Int64
	if err := rdb.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		masters.Add(1)
		return c.Ping(ctx).Err()
	}); err != nil {
		t.Fatal(err)
	}
	if n := masters.Load(); n != redistest.ClusterMasters {
		t.Fatalf("%d masters, want %d", n, redistest.ClusterMasters)
	}
	// Keys spread over the slots of every master are served.
	seen := map[string]bool{}
	for i := range 64 {
		k := "redistest:cluster:" + strconv.Itoa(i)
		if err := rdb.Set(ctx, k, i, 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", k, err)
		}
		node, err := rdb.MasterForKey(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		seen[node.Options().Addr] = true
		rdb.Del(ctx, k)
	}
	if len(seen) != redistest.ClusterMasters {
		t.Fatalf("64 keys landed on %d masters, want %d", len(seen), redistest.ClusterMasters)
	}
}
