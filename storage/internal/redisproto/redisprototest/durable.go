package redisprototest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/internal/redisproto"
)

// Server sends one command to a server, as [Harness.Do] does.
type Server func(ctx context.Context, args ...string) (redisproto.Reply, error)

// Durable is what [RunDurable] needs: a primary with one replica.
type Durable struct {
	// New returns a store on the primary whose Complete waits for d (the
	// store's WithDurability).
	New func(d redisproto.Durability) Store
	// Primary and Replica send a command to each server.
	Primary, Replica Server
	// StopReplica stops the replica for good.
	StopReplica func()
	// AOF: both servers run with appendonly yes, and know WAITAOF (Redis
	// 7.2 and newer, Valkey 8.0 and newer). Otherwise the primary runs
	// without an append-only file.
	AOF bool
}

// RunDurable checks a store's WithDurability against a real replica: a
// Complete that returns nil has the done entry on the replica already (it
// is read there at once, no waiting); with the replica stopped, Complete
// returns ErrNotDurable after the wait's timeout, and the record stands
// on the primary (another owner's Acquire replays it). Without an
// append-only file, a wait for its fsync is not confirmed either.
func RunDurable(t *testing.T, h Durable) {
	ctx := t.Context()
	waitLink(t, h.Replica)
	d := redisproto.Durability{Replicas: 1, AOF: h.AOF, Timeout: 10 * time.Second}
	s := h.New(d)
	for i, k := range []string{"first", "second", "third"} {
		acquire(t, s, k, "owner", storage.Acquired)
		rec := []byte("the record of " + k)
		if err := s.Complete(ctx, k, "owner", rec, time.Hour); err != nil {
			t.Fatalf("complete %d with %+v: %v", i, d, err)
		}
		// Read on the replica at once: the store waited for it.
		keys := do(t, Harness{Do: h.Primary}, "KEYS", "*"+k)
		if keys.Kind != redisproto.Array || len(keys.Array) != 1 {
			t.Fatalf("the primary has %+v for %s", keys, k)
		}
		onPrimary, err := h.Primary(ctx, "GET", keys.Array[0].Str)
		if err != nil {
			t.Fatal(err)
		}
		onReplica, err := h.Replica(ctx, "GET", keys.Array[0].Str)
		if err != nil || onReplica.Kind != redisproto.String || onReplica.Str != onPrimary.Str {
			t.Fatalf("complete %d returned, and the replica has %+v, %v; want the primary's done entry", i, onReplica, err)
		}
	}
	if !h.AOF {
		aof := h.New(redisproto.Durability{AOF: true, Timeout: time.Second})
		acquire(t, aof, "aof", "owner", storage.Acquired)
		if err := aof.Complete(ctx, "aof", "owner", []byte("r"), time.Hour); !errors.Is(err, storage.ErrNotDurable) {
			t.Fatalf("a wait for the fsync of a primary without an append-only file: %v, want ErrNotDurable", err)
		}
		if res := acquire(t, aof, "aof", "another", storage.Done); string(res.Record) != "r" {
			t.Fatalf("the record after an unconfirmed wait: %q", res.Record)
		}
	}

	h.StopReplica()
	d.Timeout = 200 * time.Millisecond
	s = h.New(d)
	acquire(t, s, "unconfirmed", "owner", storage.Acquired)
	began := time.Now()
	err := s.Complete(ctx, "unconfirmed", "owner", []byte("kept on the primary"), time.Hour)
	if !errors.Is(err, storage.ErrNotDurable) {
		t.Fatalf("complete with the replica stopped: %v, want ErrNotDurable", err)
	}
	if took := time.Since(began); took < d.Timeout {
		t.Errorf("complete gave up after %v, before the wait's timeout of %v", took, d.Timeout)
	}
	if res := acquire(t, s, "unconfirmed", "another", storage.Done); string(res.Record) != "kept on the primary" {
		t.Fatalf("the record after an unconfirmed wait: %q, want it kept on the primary", res.Record)
	}
}

// waitLink waits until the replica's link to its primary is up (its
// initial sync done), for up to 10 seconds: the state of another
// process, polled.
func waitLink(t *testing.T, replica Server) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, err := replica(t.Context(), "INFO", "replication")
		if err == nil && strings.Contains(r.Str, "master_link_status:up") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica's link is not up after 10 s: %+v, %v", r, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
