package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/memstore"
)

// blockingStore is a store that never answers: each call waits for its
// context to end.
type blockingStore struct{}

func (blockingStore) Acquire(ctx context.Context, _, _, _ string, _ time.Duration) (storage.Result, error) {
	<-ctx.Done()
	return storage.Result{}, ctx.Err()
}

func (blockingStore) Complete(ctx context.Context, _, _ string, _ []byte, _ time.Duration) error {
	<-ctx.Done()
	return ctx.Err()
}

func (blockingStore) Release(ctx context.Context, _, _ string) error {
	<-ctx.Done()
	return ctx.Err()
}

func (blockingStore) Extend(ctx context.Context, _, _ string, _ time.Duration) error {
	<-ctx.Done()
	return ctx.Err()
}

// withTimeout ends each call of a store that does not answer, and keeps
// the store's optional interfaces, and only those.
func TestWithTimeout(t *testing.T) {
	s := withTimeout(blockingStore{}, 50*time.Millisecond)
	ctx := t.Context()
	checks := map[string]error{}
	_, checks["Acquire"] = s.Acquire(ctx, "k", "o", "fp", time.Second)
	checks["Complete"] = s.Complete(ctx, "k", "o", nil, time.Second)
	checks["Release"] = s.Release(ctx, "k", "o")
	checks["Extend"] = s.Extend(ctx, "k", "o", time.Second)
	for name, err := range checks {
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s on a store that does not answer: %v, want DeadlineExceeded", name, err)
		}
	}
	if _, ok := s.(storage.Issuer); ok {
		t.Error("the wrapper of a store that is no Issuer is one")
	}
	if _, ok := s.(storage.Inspector); ok {
		t.Error("the wrapper of a store that is no Inspector is one")
	}

	ms := memstore.New()
	t.Cleanup(func() { ms.Close() })
	w := withTimeout(ms, time.Second)
	iss, isIssuer := w.(storage.Issuer)
	ins, isInspector := w.(storage.Inspector)
	if !isIssuer || !isInspector {
		t.Fatalf("the wrapper of memstore: Issuer %v, Inspector %v; want both", isIssuer, isInspector)
	}
	if err := iss.Issue(ctx, "issued", time.Minute); err != nil {
		t.Fatal(err)
	}
	if res, err := iss.AcquireIssued(ctx, "issued", "o", "fp", time.Minute); err != nil || res.State != storage.Acquired {
		t.Fatalf("AcquireIssued: %v %v", res.State, err)
	}
	if e, err := ins.Lookup(ctx, "issued", false); err != nil || e.State != storage.InFlight {
		t.Fatalf("Lookup: %+v %v", e, err)
	}
	if withTimeout(ms, 0) != storage.Store(ms) {
		t.Error("withTimeout with no bound wraps the store")
	}
}

// The stores' timeouts have their documented defaults, and the memory
// store's bound is memstore's.
func TestStoreDefaults(t *testing.T) {
	c, err := parseConfig("g.yaml", []byte(base))
	if err != nil {
		t.Fatal(err)
	}
	if n := c.Store.Memory.MaxEntries; n != memstore.DefaultMaxEntries {
		t.Errorf("store.memory.max_entries: %d, want memstore's %d", n, memstore.DefaultMaxEntries)
	}
	pg, err := parseConfig("g.yaml", []byte(strings.Replace(base, "memory: {}", `postgres: {dsn: "postgres://u@h/db"}`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if d := pg.Store.Postgres.Timeout; d != time.Second {
		t.Errorf("store.postgres.timeout: %v, want 1s", d)
	}
	ddb, err := parseConfig("g.yaml", []byte(strings.Replace(base, "memory: {}", `dynamodb: {table: orders_idem}`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if s := ddb.Store.DynamoDB; s.Timeout != time.Second || s.CreateTable || s.Region != "" || s.Endpoint != "" {
		t.Errorf("store.dynamodb: %+v, want a timeout of 1s, no create_table, no region and no endpoint", s)
	}
	arn, err := parseConfig("g.yaml", []byte(strings.Replace(base, "memory: {}",
		`dynamodb: {table: "arn:aws:dynamodb:eu-west-1:123456789012:table/orders_idem", region: eu-west-1, endpoint: "http://localhost:8000"}`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if s := arn.Store.DynamoDB; s.Region != "eu-west-1" || s.Endpoint != "http://localhost:8000" {
		t.Errorf("store.dynamodb: %+v", s)
	}
}
