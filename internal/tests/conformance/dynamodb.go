package conformance

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/idemkit/idem/internal/dynamotest"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/dynamostore"
)

// DynamoDB: dynamostore on a table of the test's own on the binary's
// shared dynalite (skipped when dynalite is not installed, unless
// IDEM_REQUIRE_DYNAMODB=1), deleted when the test ends. Every scenario
// runs on it: its records over 4 KiB are compressed, so the suite's
// largest (400 KiB of runs of one letter) fits an item.
func init() {
	storeKinds = append(storeKinds, storeKind{"dynamodb", func(t *testing.T) (storage.Store, func(time.Duration)) {
		endpoint := dynamotest.Endpoint(t)
		tr := &http.Transport{MaxIdleConnsPerHost: 64}
		t.Cleanup(tr.CloseIdleConnections) // last: no connection's read loop outlives the test
		client := dynamodb.New(dynamodb.Options{
			Region:       "us-east-1",
			BaseEndpoint: aws.String(endpoint),
			Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
				return aws.Credentials{AccessKeyID: "idem", SecretAccessKey: "idem"}, nil
			}),
			HTTPClient: &http.Client{Transport: tr},
		})
		table := dynamotest.Table(t)
		s, err := dynamostore.New(client, dynamostore.WithTable(table))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := client.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(table)})
			if rnf := (*types.ResourceNotFoundException)(nil); err != nil && !errors.As(err, &rnf) {
				t.Errorf("deleting table %s: %v", table, err)
			}
		})
		if err := s.CreateTable(t.Context()); err != nil {
			t.Fatal(err)
		}
		return s, dynamoAdvance(t, client, table)
	}})
}

// dynamoAdvance returns a function that moves time forward by d for the
// items of a dynamostore table, whose clock (the process's) cannot be
// moved: each item's expires_ms, and its ttl, come d sooner. It is called
// on the test's goroutine, while the scenario holds still.
func dynamoAdvance(t *testing.T, client *dynamodb.Client, table string) func(time.Duration) {
	const expires, ttl = "expires_ms", "ttl" // the attributes of dynamostore's items
	return func(d time.Duration) {
		t.Helper()
		ctx := t.Context()
		in := &dynamodb.ScanInput{TableName: aws.String(table), ConsistentRead: aws.Bool(true),
			ProjectionExpression: aws.String("id, #ex"), ExpressionAttributeNames: map[string]string{"#ex": expires}}
		for {
			out, err := client.Scan(ctx, in)
			if err != nil {
				t.Fatalf("advancing the items of %s by %v: %v", table, d, err)
			}
			for _, it := range out.Items {
				// As PostgreSQL's shift: relative to the item as it is when
				// it is written, so a lease renewed meanwhile is moved too,
				// and an item deleted meanwhile is not made again.
				_, err := client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
					TableName:                aws.String(table),
					Key:                      map[string]types.AttributeValue{"id": it["id"]},
					UpdateExpression:         aws.String("SET #ex = #ex - :d, #ttl = #ttl - :s"),
					ConditionExpression:      aws.String("attribute_exists(#ex)"),
					ExpressionAttributeNames: map[string]string{"#ex": expires, "#ttl": ttl},
					ExpressionAttributeValues: map[string]types.AttributeValue{
						":d": &types.AttributeValueMemberN{Value: strconv.FormatInt(d.Milliseconds(), 10)},
						":s": &types.AttributeValueMemberN{Value: strconv.FormatInt(int64(d/time.Second), 10)},
					},
				})
				if ccf := (*types.ConditionalCheckFailedException)(nil); err != nil && !errors.As(err, &ccf) {
					t.Fatalf("advancing item %v of %s by %v: %v", it["id"], table, d, err)
				}
			}
			if len(out.LastEvaluatedKey) == 0 {
				return
			}
			in.ExclusiveStartKey = out.LastEvaluatedKey
		}
	}
}
