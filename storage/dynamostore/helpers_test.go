package dynamostore_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/idemkit/idem/internal/dynamotest"
	"github.com/idemkit/idem/internal/testclock"
	"github.com/idemkit/idem/storage/dynamostore"
)

// storeMax is the WithMaxRecordBytes of the tests' stores, the contract
// suite's MaxRecord.
const storeMax = 1<<20 + 1024

// counter counts the requests a client sends, by operation (the
// X-Amz-Target header's action: "PutItem", ...).
type counter struct {
	mu sync.Mutex
	n  map[string]int
	rt http.RoundTripper
}

func (c *counter) RoundTrip(r *http.Request) (*http.Response, error) {
	op := r.Header.Get("X-Amz-Target")
	if i := len("DynamoDB_20120810."); len(op) > i {
		op = op[i:]
	}
	c.mu.Lock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[op]++
	c.mu.Unlock()
	return c.rt.RoundTrip(r)
}

// take returns the counts so far and starts again from zero.
func (c *counter) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n
	c.n = nil
	if n == nil {
		n = map[string]int{}
	}
	return n
}

// total is the number of requests in n.
func total(n map[string]int) int {
	t := 0
	for _, v := range n {
		t += v
	}
	return t
}

// newClient returns a client of the DynamoDB API at endpoint (dynalite's:
// any region and keys), whose requests c counts when c is not nil. The
// SDK's retries stay as they are by default (3 attempts).
func newClient(endpoint string, c *counter, opts ...func(*dynamodb.Options)) *dynamodb.Client {
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	var rt http.RoundTripper = tr
	if c != nil {
		c.rt = tr
		rt = c
	}
	o := dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(endpoint),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "idem", SecretAccessKey: "idem"}, nil
		}),
		HTTPClient: &http.Client{Transport: rt},
	}
	for _, f := range opts {
		f(&o)
	}
	return dynamodb.New(o)
}

// newClock is a test's clock, moved by hand, starting now.
func newClock() *testclock.Clock { return testclock.New(time.Now()) }

// table is a table of the test's own on the shared dynalite.
type table struct {
	name   string
	client *dynamodb.Client
	count  *counter
}

var tables atomic.Int64

// newTable creates a table of the test's own on the shared server, with
// a client that counts its requests.
func newTable(t testing.TB) *table {
	t.Helper()
	c := &counter{}
	tb := &table{name: dynamotest.Table(t), client: newClient(dynamotest.Endpoint(t), c), count: c}
	s := tb.open(t)
	if err := s.CreateTable(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		tb.client.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(tb.name)})
	})
	tables.Add(1)
	c.take()
	return tb
}

// open returns a store on the table (records of at most storeMax bytes,
// unless opts say otherwise).
func (tb *table) open(t testing.TB, opts ...dynamostore.Option) *dynamostore.Store {
	t.Helper()
	s, err := dynamostore.New(tb.client, append([]dynamostore.Option{dynamostore.WithMaxRecordBytes(storeMax), dynamostore.WithTable(tb.name)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// raw reads the key's item as it is in the table.
func (tb *table) raw(t testing.TB, key string) map[string]types.AttributeValue {
	t.Helper()
	out, err := tb.client.GetItem(context.Background(), &dynamodb.GetItemInput{TableName: aws.String(tb.name),
		Key: map[string]types.AttributeValue{"id": &types.AttributeValueMemberS{Value: key}}, ConsistentRead: aws.Bool(true)})
	if err != nil {
		t.Fatal(err)
	}
	return out.Item
}

// allOld wraps a client whose API sends no item back with a failed
// condition (dynalite): it reads the item itself and attaches it, as
// DynamoDB does for ReturnValuesOnConditionCheckFailure ALL_OLD, so that
// the store's path for DynamoDB is tested too.
type allOld struct {
	dynamostore.Client
	table string
}

func (a allOld) attach(ctx context.Context, key map[string]types.AttributeValue, want types.ReturnValuesOnConditionCheckFailure, err error) error {
	var ccf *types.ConditionalCheckFailedException
	if want != types.ReturnValuesOnConditionCheckFailureAllOld || !errors.As(err, &ccf) || len(ccf.Item) > 0 {
		return err
	}
	out, gerr := a.Client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(a.table), Key: key, ConsistentRead: aws.Bool(true)})
	if gerr != nil {
		return gerr
	}
	return &types.ConditionalCheckFailedException{Message: ccf.Message, Item: out.Item}
}

func (a allOld) PutItem(ctx context.Context, in *dynamodb.PutItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error) {
	out, err := a.Client.PutItem(ctx, in, opts...)
	return out, a.attach(ctx, map[string]types.AttributeValue{"id": in.Item["id"]}, in.ReturnValuesOnConditionCheckFailure, err)
}

func (a allOld) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	out, err := a.Client.UpdateItem(ctx, in, opts...)
	return out, a.attach(ctx, in.Key, in.ReturnValuesOnConditionCheckFailure, err)
}

func (a allOld) DeleteItem(ctx context.Context, in *dynamodb.DeleteItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error) {
	out, err := a.Client.DeleteItem(ctx, in, opts...)
	return out, a.attach(ctx, in.Key, in.ReturnValuesOnConditionCheckFailure, err)
}
