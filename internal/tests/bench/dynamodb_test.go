package bench

import (
	"bytes"
	"compress/flate"
	"context"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/idemkit/idem/internal/dynamotest"
	"github.com/idemkit/idem/storage/dynamostore"
)

// requestCounter counts the HTTP requests of a DynamoDB client: the SDK
// sends each operation as one request and waits for its answer, so
// requests are round trips (a retry of the SDK's would be one more, and
// counted). It allocates nothing, so that the allocations measured are
// the client's alone.
type requestCounter struct {
	n  atomic.Int64
	rt http.RoundTripper
}

func (c *requestCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.rt.RoundTrip(r)
}

func (c *requestCounter) Reset()            { c.n.Store(0) }
func (c *requestCounter) RoundTrips() int64 { return c.n.Load() }

// openDynamoDB opens dynamostore on a table of the setup's own (created
// with Store.CreateTable, deleted at cleanup) on the test binary's
// dynalite (see internal/dynamotest: skipped without one, unless
// IDEM_REQUIRE_DYNAMODB=1), through a *dynamodb.Client built as
// storage/dynamostore's tests build theirs: static credentials, region
// us-east-1, the endpoint as BaseEndpoint, the SDK's defaults otherwise
// (its retries, its middleware stack, SigV4 signing), and an
// http.Transport whose requests a requestCounter counts.
//
// With large, it checks that the 1 MiB body fits a DynamoDB item: a
// record over MaxStoredRecordBytes once compressed is refused with
// ErrTooLarge by design, and the middleware would then answer the first
// request all the same, keeping the key done but not replayable, which a
// large case would not see. largeBody (a 16-byte pattern) deflates to a
// few KiB: it is kept compressed, in record_z.
func openDynamoDB(tb testing.TB, large bool) store {
	tb.Helper()
	endpoint := dynamotest.Endpoint(tb)
	if large {
		if z := deflated(largeBody); z > dynamostore.MaxStoredRecordBytes {
			tb.Skipf("dynamodb: the large body deflates to %d bytes, over the %d an item keeps (ErrTooLarge by design)",
				z, dynamostore.MaxStoredRecordBytes)
		}
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	tb.Cleanup(tr.CloseIdleConnections) // last: after the table is deleted
	c := &requestCounter{rt: tr}
	client := dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(endpoint),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "idem", SecretAccessKey: "idem"}, nil
		}),
		HTTPClient: &http.Client{Transport: c},
	})
	table := dynamotest.Table(tb)
	s, err := dynamostore.New(client, dynamostore.WithTable(table))
	if err != nil {
		tb.Fatal(err)
	}
	if err := s.CreateTable(context.Background()); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		client.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(table)})
	})
	return store{Store: s, dynamo: s, ddb: client, ddbCounter: c, ddbTable: table}
}

// deflated returns the length of b compressed as dynamostore compresses
// a record (raw DEFLATE, fastest level).
func deflated(b []byte) int {
	var buf bytes.Buffer
	w, _ := flate.NewWriter(&buf, flate.BestSpeed)
	w.Write(b)
	w.Close()
	return buf.Len()
}

// trimDynamoDB deletes every item of the store's table: a Scan of the
// keys, page by page, and a BatchWriteItem of the deletes, 25 at a time.
func (s store) trimDynamoDB(tb testing.TB) {
	ctx := context.Background()
	in := &dynamodb.ScanInput{TableName: aws.String(s.ddbTable), ProjectionExpression: aws.String("#id"),
		ExpressionAttributeNames: map[string]string{"#id": "id"}}
	for {
		out, err := s.ddb.Scan(ctx, in)
		if err != nil {
			tb.Fatal(err)
		}
		for items := out.Items; len(items) > 0; {
			n := min(len(items), 25)
			reqs := make([]types.WriteRequest, n)
			for i, it := range items[:n] {
				reqs[i] = types.WriteRequest{DeleteRequest: &types.DeleteRequest{Key: it}}
			}
			items = items[n:]
			for pending := map[string][]types.WriteRequest{s.ddbTable: reqs}; len(pending) > 0; {
				out, err := s.ddb.BatchWriteItem(ctx, &dynamodb.BatchWriteItemInput{RequestItems: pending})
				if err != nil {
					tb.Fatal(err)
				}
				pending = out.UnprocessedItems
			}
		}
		if len(out.LastEvaluatedKey) == 0 {
			return
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
}

// dynamoItems returns the items of the store's table (a consistent Scan,
// one page).
func (s store) dynamoItems(tb testing.TB) []map[string]types.AttributeValue {
	tb.Helper()
	out, err := s.ddb.Scan(context.Background(), &dynamodb.ScanInput{TableName: aws.String(s.ddbTable), ConsistentRead: aws.Bool(true)})
	if err != nil {
		tb.Fatal(err)
	}
	return out.Items
}

// itemSize is an item's size as DynamoDB counts it against its 400 KB
// limit: each attribute's name and value, a string or binary value its
// bytes, a number about one byte per two significant digits and one more.
func itemSize(item map[string]types.AttributeValue) int {
	n := 0
	for name, v := range item {
		n += len(name)
		switch v := v.(type) {
		case *types.AttributeValueMemberS:
			n += len(v.Value)
		case *types.AttributeValueMemberB:
			n += len(v.Value)
		case *types.AttributeValueMemberN:
			n += (len(v.Value)+1)/2 + 1
		case *types.AttributeValueMemberBOOL, *types.AttributeValueMemberNULL:
			n++
		}
	}
	return n
}

// TestDynamoDBRoundTrips counts with requestCounter: the HTTP requests of
// the store's client. On dynalite a replay and a conflict each cost a
// consistent GetItem after the failed conditional PutItem (see
// dynamoRoundTrips).
func TestDynamoDBRoundTrips(t *testing.T) { testRoundTrips(t, storeKindNamed("dynamodb")) }
