package redisstore_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idemkit/idem/internal/redistest"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/idemkit/idem/storage/storagetest"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { redistest.Main(m) }

var ctx = context.Background()

func miniStore(t *testing.T, opts ...redisstore.Option) (*redisstore.Store, *miniredis.Miniredis, *redis.Client) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	return redisstore.New(rdb, opts...), mr, rdb
}

func TestContractMiniredis(t *testing.T) {
	storagetest.Run(t, func(t *testing.T) storagetest.Harness {
		s, mr, _ := miniStore(t)
		return storagetest.Harness{Store: s, Advance: mr.FastForward}
	})
}

func TestContractRedis(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr(t)})
	t.Cleanup(func() { rdb.Close() })
	storagetest.Run(t, func(t *testing.T) storagetest.Harness {
		return storagetest.Harness{Store: redisstore.New(rdb, redisstore.WithPrefix("contract:"))}
	})
}

// TestOneRoundTripEach counts the commands each operation sends to a real
// server, after the scripts are cached.
func TestOneRoundTripEach(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr(t)})
	t.Cleanup(func() { rdb.Close() })
	var c redistest.CommandCounter
	rdb.AddHook(&c)
	s := redisstore.New(rdb, redisstore.WithPrefix("rt:"))
	// Warm the script cache once.
	s.Acquire(ctx, "warm", "o", "", time.Second)
	s.Extend(ctx, "warm", "o", time.Second)
	s.Complete(ctx, "warm", "o", []byte("r"), time.Second)
	s.Release(ctx, "warm2", "o")
	for _, step := range []struct {
		name string
		op   func() error
	}{
		{"acquire", func() error { _, err := s.Acquire(ctx, "k", "o", "fp", time.Minute); return err }},
		{"extend", func() error { return s.Extend(ctx, "k", "o", time.Minute) }},
		{"complete", func() error { return s.Complete(ctx, "k", "o", []byte("rec"), time.Minute) }},
		{"replay", func() error { _, err := s.Acquire(ctx, "k", "o2", "fp", time.Minute); return err }},
		{"release", func() error { return s.Release(ctx, "missing", "o") }},
	} {
		name, op := step.name, step.op
		c.Reset()
		if err := op(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if n := c.Count(); n != 1 {
			t.Errorf("%s took %d round trips, want 1", name, n)
		}
	}
}

func TestScriptFlushFallsBackToEval(t *testing.T) {
	s, mr, rdb := miniStore(t)
	s.Acquire(ctx, "k", "o", "", time.Minute)
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, "k", "o", []byte("r"), time.Minute); err != nil {
		t.Fatalf("Complete after SCRIPT FLUSH: %v", err)
	}
	if v, _ := mr.Get("idem:k"); v != "D\x00r" {
		t.Fatalf("stored %q", v)
	}
}

func TestPrefixLayoutAndTTL(t *testing.T) {
	s, mr, _ := miniStore(t, redisstore.WithPrefix("app:"))
	s.Acquire(ctx, "k", "owner", "fp", 1500*time.Millisecond)
	if v, _ := mr.Get("app:k"); v != "P\x02fpowner" {
		t.Fatalf("processing value %q", v)
	}
	if ttl := mr.TTL("app:k"); ttl != 1500*time.Millisecond {
		t.Fatalf("processing TTL %v", ttl)
	}
	s.Complete(ctx, "k", "owner", []byte{0, 1, 2}, 36*time.Hour)
	if v, _ := mr.Get("app:k"); v != "D\x02fp\x00\x01\x02" {
		t.Fatalf("done value %q", v)
	}
	if ttl := mr.TTL("app:k"); ttl != 36*time.Hour {
		t.Fatalf("done TTL %v", ttl)
	}
	if keys := mr.Keys(); len(keys) != 1 {
		t.Fatalf("keys %v", keys)
	}
}

func TestEveryKeyHasTTLOnRealRedis(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr(t)})
	t.Cleanup(func() { rdb.Close() })
	s := redisstore.New(rdb, redisstore.WithPrefix("ttl:"))
	s.Acquire(ctx, "a", "o", "", 100*time.Microsecond+time.Second)
	s.Acquire(ctx, "b", "o", "", time.Minute)
	s.Complete(ctx, "b", "o", []byte("r"), time.Hour)
	for _, k := range []string{"ttl:a", "ttl:b"} {
		if d := rdb.PTTL(ctx, k).Val(); d <= 0 {
			t.Fatalf("%s PTTL %v", k, d)
		}
	}
	if d := rdb.PTTL(ctx, "ttl:b").Val(); d < 59*time.Minute {
		t.Fatalf("done PTTL %v, want about an hour", d)
	}
}

func TestStoreErrors(t *testing.T) {
	s, mr, _ := miniStore(t)
	mr.SetError("LOADING Redis is loading the dataset in memory")
	_, err := s.Acquire(ctx, "k", "o", "", time.Minute)
	if err == nil || errors.Is(err, storage.ErrNotOwner) {
		t.Fatalf("Acquire with a failing server: %v", err)
	}
	if err := s.Complete(ctx, "k", "o", nil, time.Minute); err == nil || errors.Is(err, storage.ErrNotOwner) {
		t.Fatalf("Complete with a failing server: %v", err)
	}
	mr.SetError("")
	mr.Close()
	if _, err := s.Acquire(ctx, "k", "o", "", time.Minute); err == nil {
		t.Fatal("Acquire with the server closed: no error")
	}
}

func TestMalformedValue(t *testing.T) {
	s, mr, _ := miniStore(t)
	for _, v := range []string{"garbage", "D", "P", "X\x00abc", "D\x09short"} {
		mr.Set("idem:bad", v)
		if res, err := s.Acquire(ctx, "bad", "o", "", time.Minute); err == nil {
			t.Errorf("Acquire over %q: %+v, want an error", v, res)
		}
		if err := s.Complete(ctx, "bad", "o", []byte("r"), time.Minute); err == nil {
			t.Errorf("Complete over %q: no error", v)
		}
		if got, _ := mr.Get("idem:bad"); got != v {
			t.Errorf("value %q changed to %q", v, got)
		}
	}
}

func TestBinaryRecordRealRedis(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Addr(t)})
	t.Cleanup(func() { rdb.Close() })
	s := redisstore.New(rdb, redisstore.WithPrefix("bin:"))
	rec := []byte{0, 'D', 0xff, '\r', '\n', 0}
	s.Acquire(ctx, "k", "o", "\x00\xff", time.Minute)
	s.Complete(ctx, "k", "o", rec, time.Minute)
	res, err := s.Acquire(ctx, "k", "o2", "", time.Minute)
	if err != nil || !bytes.Equal(res.Record, rec) || res.Fingerprint != "\x00\xff" {
		t.Fatalf("%+v %v", res, err)
	}
}
