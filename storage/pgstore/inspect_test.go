package pgstore_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/pgstore"
)

// TestInspectFencedEntry: while a transaction that fenced an entry is
// open, Lookup answers at once with the entry as the transaction found it
// (in flight), and Remove answers ErrLocked at once, changing nothing;
// once the transaction has rolled back, Remove deletes the entry.
func TestInspectFencedEntry(t *testing.T) {
	d := open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // a wait would fail the test
	defer cancel()
	if _, err := d.store.Acquire(ctx, "k", "o1", "fp", time.Minute); err != nil {
		t.Fatal(err)
	}
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if err := d.store.Fence(storage.ContextWithLease(ctx, storage.Lease{Key: "k", Owner: "o1", TTL: time.Hour}), tx); err != nil {
		t.Fatal(err)
	}
	e, err := d.store.Lookup(ctx, "k", true)
	if err != nil || e.State != storage.InFlight || e.Fingerprint != "fp" || e.LeaseLeft <= 0 {
		t.Fatalf("Lookup of a fenced entry: %+v, %v; want it in flight, as the open transaction found it", e, err)
	}
	if _, err := d.store.Remove(ctx, "k", e.Version); !errors.Is(err, pgstore.ErrLocked) {
		t.Fatalf("Remove of a fenced entry: %v, want ErrLocked", err)
	}
	if got := d.state("k"); got != "processing" {
		t.Fatalf("after the refused Remove: state %q, want processing", got)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if e, err := d.store.Remove(ctx, "k", e.Version); err != nil || e.State != storage.InFlight {
		t.Fatalf("Remove once the transaction rolled back: %+v, %v", e, err)
	}
	if got := d.state("k"); got != "" {
		t.Fatalf("after Remove: state %q, want no row", got)
	}
}

// TestListOrder: a listing of one state comes oldest Since first across
// pages, rows written before the since column (NULL) first of all; MinAge
// leaves those out, and the younger rows; expired rows are left out but
// still move the cursor. A listing of every state comes in key order.
func TestListOrder(t *testing.T) {
	pool := testPool(t)
	clock, advance := frozenClock(t, pool)
	d := openOn(t, pool, pgstore.WithClock(clock))
	ctx := context.Background()
	d.exec("INSERT INTO {table} (key, state, owner, fingerprint, expires) VALUES ('old', 'processing', 'o', 'fp', now() + interval '1 hour')")
	for _, k := range []string{"e", "d", "c", "b", "a"} {
		if _, err := d.store.Acquire(ctx, k, "o", "fp", time.Hour); err != nil {
			t.Fatal(err)
		}
		advance(time.Second)
	}
	d.exec("UPDATE {table} SET expires = now() - interval '1 second' WHERE key = 'c'") // expired, not deleted yet
	list := func(q storage.Query) []string {
		t.Helper()
		var got []string
		for pages := 0; ; pages++ {
			p, err := d.store.List(ctx, q)
			if err != nil || pages > 20 {
				t.Fatalf("List(%+v): %v after %d pages", q, err, pages)
			}
			for _, e := range p.Entries {
				got = append(got, e.Key)
			}
			if p.Next == "" {
				return got
			}
			q.Cursor = p.Next
		}
	}
	for _, limit := range []int{1, 2, 100} {
		if got, want := list(storage.Query{State: storage.InFlight, Limit: limit}), []string{"old", "e", "d", "b", "a"}; !slices.Equal(got, want) {
			t.Errorf("in flight, limit %d: %q, want %q", limit, got, want)
		}
		if got, want := list(storage.Query{Limit: limit}), []string{"a", "b", "d", "e", "old"}; !slices.Equal(got, want) {
			t.Errorf("every state, limit %d: %q, want %q", limit, got, want)
		}
		if got, want := list(storage.Query{State: storage.InFlight, MinAge: 3 * time.Second, Limit: limit}), []string{"e", "d"}; !slices.Equal(got, want) {
			t.Errorf("in flight at least 3s old, limit %d: %q, want %q", limit, got, want)
		}
		if got, want := list(storage.Query{MinAge: 3 * time.Second, Limit: limit}), []string{"d", "e"}; !slices.Equal(got, want) {
			t.Errorf("every state at least 3s old, limit %d: %q, want %q", limit, got, want)
		}
	}
	if e, err := d.store.Lookup(ctx, "old", false); err != nil || !e.Since.IsZero() || e.State != storage.InFlight {
		t.Errorf("Lookup of a row without since: %+v, %v; want in flight, a zero Since", e, err)
	}
}
