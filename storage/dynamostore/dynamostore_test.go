package dynamostore_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/idemkit/idem/internal/dynamotest"
	"github.com/idemkit/idem/internal/leakcheck"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/dynamostore"
	"github.com/idemkit/idem/storage/storagetest"
)

// Main stops the shared dynalite and checks for leaked goroutines.
func TestMain(m *testing.M) { leakcheck.Main(dynamotest.Wrap(m)) }

// TestContract runs the contract suite with each subtest's store on a
// clock of its own, which the suite moves: every clause, including the
// rounding to milliseconds, is checked exactly. One table. The store
// reads the clock of its instance, never the server's (see Clocks in the
// package documentation), so a clock moved by hand is what it reads in
// production too; on the machine's clock the clauses of one millisecond
// cannot be seen through round trips of several.
func TestContract(t *testing.T) {
	tb := newTable(t)
	storagetest.Run(t, func(t *testing.T) storagetest.Harness {
		c := newClock()
		return storagetest.Harness{Store: tb.open(t, dynamostore.WithClock(c.Now)), Advance: c.Advance, MaxRecord: storeMax}
	})
}

// TestContractAllOld runs it through a client that gets the item back
// with every failed condition, as DynamoDB does: the store's path that
// needs no read after a conflict.
func TestContractAllOld(t *testing.T) {
	tb := newTable(t)
	storagetest.Run(t, func(t *testing.T) storagetest.Harness {
		c := newClock()
		s, err := dynamostore.New(allOld{tb.client, tb.name}, dynamostore.WithTable(tb.name), dynamostore.WithMaxRecordBytes(storeMax), dynamostore.WithClock(c.Now))
		if err != nil {
			t.Fatal(err)
		}
		return storagetest.Harness{Store: s, Advance: c.Advance, MaxRecord: storeMax}
	})
}

// calls counts the store's calls of its client, by operation.
type calls struct {
	dynamostore.Client
	mu sync.Mutex
	n  map[string]int
}

func (c *calls) add(op string) {
	c.mu.Lock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[op]++
	c.mu.Unlock()
}

func (c *calls) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n
	c.n = nil
	if n == nil {
		n = map[string]int{}
	}
	return n
}

func (c *calls) GetItem(ctx context.Context, in *dynamodb.GetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	c.add("GetItem")
	return c.Client.GetItem(ctx, in, opts...)
}

func (c *calls) PutItem(ctx context.Context, in *dynamodb.PutItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error) {
	c.add("PutItem")
	return c.Client.PutItem(ctx, in, opts...)
}

func (c *calls) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	c.add("UpdateItem")
	return c.Client.UpdateItem(ctx, in, opts...)
}

func (c *calls) DeleteItem(ctx context.Context, in *dynamodb.DeleteItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error) {
	c.add("DeleteItem")
	return c.Client.DeleteItem(ctx, in, opts...)
}

// TestRoundTrips counts the requests of each step of an execution: a
// first execution is one PutItem and one UpdateItem; a replay, one
// PutItem whose failed condition brings the record back from DynamoDB,
// or, from an API that does not send it (dynalite), a consistent GetItem
// more; a duplicate in flight, the same; a renewal, one UpdateItem; a
// release, one DeleteItem.
func TestRoundTrips(t *testing.T) {
	tb := newTable(t)
	for _, c := range []struct {
		name     string
		allOld   bool
		conflict map[string]int
	}{
		{"dynalite", false, map[string]int{"PutItem": 1, "GetItem": 1}},
		{"ALL_OLD", true, map[string]int{"PutItem": 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var client dynamostore.Client = tb.client
			if c.allOld {
				client = allOld{tb.client, tb.name}
			}
			n := &calls{Client: client}
			s, err := dynamostore.New(n, dynamostore.WithTable(tb.name))
			if err != nil {
				t.Fatal(err)
			}
			ctx := t.Context()
			step := func(what string, want map[string]int, f func() error) {
				t.Helper()
				if err := f(); err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				if got := n.take(); !equal(got, want) {
					t.Errorf("%s: %v, want %v", what, got, want)
				}
			}
			key := "rt:" + rand.Text()
			step("first Acquire", map[string]int{"PutItem": 1}, func() error {
				_, err := s.Acquire(ctx, key, "o1", "fp", time.Minute)
				return err
			})
			step("duplicate in flight", c.conflict, func() error {
				res, err := s.Acquire(ctx, key, "o2", "fp", time.Minute)
				if err == nil && res.State != storage.InFlight {
					t.Errorf("duplicate: %v, want in flight", res.State)
				}
				return err
			})
			step("Extend", map[string]int{"UpdateItem": 1}, func() error { return s.Extend(ctx, key, "o1", time.Minute) })
			step("Complete", map[string]int{"UpdateItem": 1}, func() error { return s.Complete(ctx, key, "o1", []byte("rec"), time.Hour) })
			step("replay", c.conflict, func() error {
				res, err := s.Acquire(ctx, key, "o3", "fp", time.Minute)
				if err == nil && (res.State != storage.Done || string(res.Record) != "rec") {
					t.Errorf("replay: %v %q, want done", res.State, res.Record)
				}
				return err
			})
			key2 := "rt:" + rand.Text()
			s.Acquire(ctx, key2, "o1", "fp", time.Minute)
			n.take()
			step("Release", map[string]int{"DeleteItem": 1}, func() error { return s.Release(ctx, key2, "o1") })
		})
	}
}

func equal(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// incompressible returns n random bytes.
func incompressible(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// TestRecordSizes: DynamoDB keeps at most 400 KB an item. A record that
// does not fit once compressed is refused before anything is sent
// (ErrTooLarge, the entry still the owner's); one that fits is kept whole,
// whether it was compressed or not; a compressible record larger than the
// item limit is kept compressed.
func TestRecordSizes(t *testing.T) {
	tb := newTable(t)
	s := tb.open(t, dynamostore.WithMaxRecordBytes(8<<20))
	ctx := t.Context()
	for _, c := range []struct {
		name    string
		rec     []byte
		tooBig  bool
		wantRaw bool // kept uncompressed
	}{
		{"incompressible at the limit", incompressible(dynamostore.MaxStoredRecordBytes), false, true},
		{"incompressible a byte over", incompressible(dynamostore.MaxStoredRecordBytes + 1), true, false},
		{"incompressible 1 MiB", incompressible(1 << 20), true, false},
		{"small", []byte(`{"id":1}`), false, true},
		{"JSON of 4 MiB", bytes.Repeat([]byte(`{"id":12345,"name":"a line item","qty":3},`), 4<<20/42), false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			key := "size:" + rand.Text()
			if _, err := s.Acquire(ctx, key, "o1", "fp", time.Minute); err != nil {
				t.Fatal(err)
			}
			tb.count.take()
			err := s.Complete(ctx, key, "o1", c.rec, time.Hour)
			sent := total(tb.count.take())
			if c.tooBig {
				if !errors.Is(err, storage.ErrTooLarge) || sent != 0 {
					t.Fatalf("Complete of %d bytes: %v after %d requests, want ErrTooLarge before any", len(c.rec), err, sent)
				}
				if err := s.Complete(ctx, key, "o1", []byte("small"), time.Hour); err != nil {
					t.Fatalf("the owner's Complete after ErrTooLarge: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Complete of %d bytes: %v", len(c.rec), err)
			}
			res, err := s.Acquire(ctx, key, "o2", "fp", time.Minute)
			if err != nil || res.State != storage.Done || !bytes.Equal(res.Record, c.rec) {
				t.Fatalf("replay: %v, %v with %d bytes, want done with %d", err, res.State, len(res.Record), len(c.rec))
			}
			item := tb.raw(t, key)
			_, raw := item["record"]
			_, z := item["record_z"]
			if raw != c.wantRaw || z == c.wantRaw {
				t.Errorf("item has record %v, record_z %v; want the record kept raw: %v", raw, z, c.wantRaw)
			}
			e, err := s.Lookup(ctx, key, false)
			if err != nil || e.Size != len(c.rec) {
				t.Errorf("Lookup: %v, size %d, want %d", err, e.Size, len(c.rec))
			}
		})
	}
}

// TestItems shows what the table holds, for an operator reading it in the
// console: the attributes the package documentation describes, the TTL
// in seconds never before the entry's end.
func TestItems(t *testing.T) {
	tb := newTable(t)
	c := newClock()
	s := tb.open(t, dynamostore.WithClock(c.Now))
	ctx := t.Context()
	key := "items:" + rand.Text()
	if _, err := s.Acquire(ctx, key, "owner-1", "fp", 1500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	now := c.Now().UnixMilli()
	want := func(item map[string]types.AttributeValue, name, value string) {
		t.Helper()
		var got string
		switch v := item[name].(type) {
		case *types.AttributeValueMemberS:
			got = v.Value
		case *types.AttributeValueMemberN:
			got = v.Value
		case *types.AttributeValueMemberB:
			got = string(v.Value)
		}
		if got != value {
			t.Errorf("%s = %q, want %q", name, got, value)
		}
	}
	item := tb.raw(t, key)
	want(item, "state", "processing")
	want(item, "owner", "owner-1")
	want(item, "fingerprint", "fp")
	want(item, "expires_ms", itoa(now+1500))
	want(item, "ttl", itoa((now+1500+999)/1000))
	want(item, "since_ms", itoa(now))
	if err := s.Complete(ctx, key, "owner-1", []byte("rec"), time.Hour); err != nil {
		t.Fatal(err)
	}
	item = tb.raw(t, key)
	want(item, "state", "done")
	want(item, "record", "rec")
	want(item, "size", "3")
	want(item, "expires_ms", itoa(now+3600_000))
	want(item, "ttl", itoa((now+3600_000+999)/1000))
}

func itoa(i int64) string { return strconv.FormatInt(i, 10) }

// TestExpiredItemsAreAbsent: DynamoDB's TTL deletes an expired item late,
// or never on an API without it: an item past its end is treated as
// absent by every operation, and taken by the next Acquire.
func TestExpiredItemsAreAbsent(t *testing.T) {
	tb := newTable(t)
	c := newClock()
	s := tb.open(t, dynamostore.WithClock(c.Now))
	ctx := t.Context()
	key := "expired:" + rand.Text()
	s.Acquire(ctx, key, "o1", "fp", time.Minute)
	if err := s.Complete(ctx, key, "o1", []byte("old"), time.Hour); err != nil {
		t.Fatal(err)
	}
	c.Advance(time.Hour)
	if tb.raw(t, key) == nil {
		t.Fatal("the item is gone: the test needs it still in the table")
	}
	if _, err := s.Lookup(ctx, key, false); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("Lookup of an expired item: %v, want ErrNotFound", err)
	}
	res, err := s.Acquire(ctx, key, "o2", "fp2", time.Minute)
	if err != nil || res.State != storage.Acquired {
		t.Fatalf("Acquire of an expired item: %v %v, want acquired", res.State, err)
	}
	if err := s.Complete(ctx, key, "o1", []byte("old"), time.Hour); !errors.Is(err, storage.ErrNotOwner) {
		t.Fatalf("the old owner's Complete: %v, want ErrNotOwner", err)
	}
}

// TestCorrupt: an item that is not the store's (another application's,
// under the same key) is ErrCorrupt, never taken or overwritten.
func TestCorrupt(t *testing.T) {
	tb := newTable(t)
	s := tb.open(t)
	ctx := t.Context()
	for name, item := range map[string]map[string]types.AttributeValue{
		"no state":      {"payload": &types.AttributeValueMemberS{Value: "x"}},
		"unknown state": {"state": &types.AttributeValueMemberS{Value: "paid"}, "expires_ms": &types.AttributeValueMemberN{Value: "99999999999999"}},
		"no expiry":     {"state": &types.AttributeValueMemberS{Value: "done"}, "owner": &types.AttributeValueMemberB{Value: []byte("o")}},
		"huge size": {"state": &types.AttributeValueMemberS{Value: "done"}, "owner": &types.AttributeValueMemberB{Value: []byte("o")},
			"expires_ms": &types.AttributeValueMemberN{Value: "99999999999999"}, "size": &types.AttributeValueMemberN{Value: "99999999999"},
			"record_z": &types.AttributeValueMemberB{Value: []byte{1, 2, 3}}},
		"damaged compressed record": {"state": &types.AttributeValueMemberS{Value: "done"}, "owner": &types.AttributeValueMemberB{Value: []byte("o")},
			"expires_ms": &types.AttributeValueMemberN{Value: "99999999999999"}, "size": &types.AttributeValueMemberN{Value: "100"},
			"record_z": &types.AttributeValueMemberB{Value: []byte{1, 2, 3}}},
	} {
		t.Run(name, func(t *testing.T) {
			key := "corrupt:" + rand.Text()
			item["id"] = &types.AttributeValueMemberS{Value: key}
			if _, err := tb.client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(tb.name), Item: item}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Acquire(ctx, key, "o1", "fp", time.Minute); !errors.Is(err, storage.ErrCorrupt) {
				t.Errorf("Acquire: %v, want ErrCorrupt", err)
			}
			if got := tb.raw(t, key); len(got) != len(item) {
				t.Errorf("the item changed: %v", got)
			}
		})
	}
}

// TestPing: a missing table, or one keyed otherwise, is a clear error at
// startup (ErrTable); the store's own table passes.
func TestPing(t *testing.T) {
	tb := newTable(t)
	ctx := t.Context()
	if err := tb.open(t).Ping(ctx); err != nil {
		t.Fatalf("Ping of the store's table: %v", err)
	}
	missing, _ := dynamostore.New(tb.client, dynamostore.WithTable(tb.name+"_missing"))
	if err := missing.Ping(ctx); !errors.Is(err, dynamostore.ErrTable) || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("Ping of a missing table: %v, want ErrTable", err)
	}
	other := dynamotest.Table(t)
	_, err := tb.client.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName: aws.String(other),
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("pk"), AttributeType: types.ScalarAttributeTypeS},
			{AttributeName: aws.String("sk"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema: []types.KeySchemaElement{{AttributeName: aws.String("pk"), KeyType: types.KeyTypeHash},
			{AttributeName: aws.String("sk"), KeyType: types.KeyTypeRange}},
		BillingMode: types.BillingModePayPerRequest,
	})
	if err != nil {
		t.Fatal(err)
	}
	wrong, _ := dynamostore.New(tb.client, dynamostore.WithTable(other))
	if err := wrong.Ping(ctx); !errors.Is(err, dynamostore.ErrTable) {
		t.Errorf("Ping of a table keyed otherwise: %v, want ErrTable", err)
	}
	if err := wrong.CreateTable(ctx); !errors.Is(err, dynamostore.ErrTable) {
		t.Errorf("CreateTable over a table keyed otherwise: %v, want ErrTable", err)
	}
	// CreateTable of a table that exists is a no-op.
	if err := tb.open(t).CreateTable(ctx); err != nil {
		t.Errorf("CreateTable again: %v", err)
	}
}

// TestInvalid: keys DynamoDB cannot hold are ErrInvalid, sent nowhere.
func TestInvalid(t *testing.T) {
	tb := newTable(t)
	s := tb.open(t)
	ctx := t.Context()
	for name, key := range map[string]string{"too long": strings.Repeat("k", dynamostore.MaxKeyBytes+1), "not UTF-8": "k\xff"} {
		if _, err := s.Acquire(ctx, key, "o", "fp", time.Minute); !errors.Is(err, storage.ErrInvalid) {
			t.Errorf("Acquire of a key %s: %v, want ErrInvalid", name, err)
		}
	}
	if _, err := s.Acquire(ctx, "k", strings.Repeat("o", dynamostore.MaxOwnerBytes+1), "fp", time.Minute); !errors.Is(err, storage.ErrInvalid) {
		t.Errorf("Acquire with a long owner: %v, want ErrInvalid", err)
	}
	if n := total(tb.count.take()); n != 0 {
		t.Errorf("%d requests sent", n)
	}
	if _, err := dynamostore.New(nil); err == nil {
		t.Error("New(nil): no error")
	}
}

// TestConcurrentDuplicates: 64 callers acquire one key at once, on
// stores of their own (instances of a service): exactly one acquires, and
// the others see it in flight with its fingerprint.
func TestConcurrentDuplicates(t *testing.T) {
	tb := newTable(t)
	ctx := t.Context()
	key := "dup:" + rand.Text()
	const n = 64
	var acquired, inFlight atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		s := tb.open(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res, err := s.Acquire(ctx, key, "owner-"+itoa(int64(i)), "fp", time.Minute)
			switch {
			case err != nil:
				t.Error(err)
			case res.State == storage.Acquired:
				acquired.Add(1)
			case res.State == storage.InFlight && res.Fingerprint == "fp":
				inFlight.Add(1)
			default:
				t.Errorf("%+v", res)
			}
		}()
	}
	close(start)
	wg.Wait()
	if acquired.Load() != 1 || inFlight.Load() != n-1 {
		t.Fatalf("%d acquired, %d in flight, want 1 and %d", acquired.Load(), inFlight.Load(), n-1)
	}
}
