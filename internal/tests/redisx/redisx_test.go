package redisx_test

import (
	"context"
	"testing"

	"github.com/idemkit/idem/internal/leakcheck"
	"github.com/idemkit/idem/internal/redistest"
	"github.com/idemkit/idem/internal/tests/redisx"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { leakcheck.Main(redistest.Wrap(m)) }

var ctx = context.Background()

func client(t *testing.T, addr string) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

func TestAddrIsSharedAndAnswers(t *testing.T) {
	a := redistest.Addr(t)
	if b := redistest.Addr(t); a != b {
		t.Fatalf("second Addr %q, first %q: want one server per test binary", b, a)
	}
	if err := client(t, a).Ping(ctx).Err(); err != nil {
		t.Fatalf("PING %s: %v", a, err)
	}
}

func TestStartIsPrivate(t *testing.T) {
	a := redistest.Start(t, "--maxmemory", "10mb")
	if a == redistest.Addr(t) {
		t.Fatal("Start returned the shared server")
	}
	got, err := client(t, a).ConfigGet(ctx, "maxmemory").Result()
	if err != nil || got["maxmemory"] != "10485760" {
		t.Fatalf("extra arguments not passed: %v %v", got, err)
	}
}

func TestCommandCounter(t *testing.T) {
	rdb := client(t, redistest.Addr(t))
	var c redisx.CommandCounter
	rdb.AddHook(&c)
	pipeline := func() {
		rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.Ping(ctx)
			p.Ping(ctx)
			p.Ping(ctx)
			return nil
		})
	}
	// Set up the connections first: a new one costs a HELLO and a pipeline
	// of its own (pipelines may use a connection of their own).
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	pipeline()

	count := func(what string, want int64, f func()) {
		t.Helper()
		c.Reset()
		f()
		if n := c.Count(); n != want {
			t.Errorf("%s: %d round trips, want %d", what, n, want)
		}
	}
	count("one command", 1, func() { rdb.Ping(ctx) })
	count("a pipeline of three", 1, pipeline)
	script := redis.NewScript(`return 7`)
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	count("a script not cached: EVALSHA, then EVAL", 2, func() { script.Run(ctx, rdb, nil) })
	count("a cached script", 1, func() { script.Run(ctx, rdb, nil) })
}
