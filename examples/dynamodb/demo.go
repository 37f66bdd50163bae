package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/idemkit/idem/examples/democlient"
)

// duplicates is how many identical requests the demo sends at once.
const duplicates = 8

// demo is -demo's client against base: package democlient's script (an
// order, its retry, the key with another body, a double click), a burst of
// identical requests, and then the orders of each key in s's orders table:
// one each, or an error. endpoint is shown in the scan's command line.
func demo(out io.Writer, base string, s *service, endpoint string) error {
	run := democlient.RunID()
	keys := []string{"order-1-" + run, "order-2-" + run, "order-3-" + run} // Play's two, the burst's
	errs := []error{
		democlient.Play(out, base, run),
		democlient.Burst(out, base, keys[2], `{"item":"lamp","amount":40}`, duplicates),
	}
	at := ""
	if endpoint != "" {
		at = " --endpoint-url " + endpoint
	}
	fmt.Fprintf(out, "\n# the orders table: one order per key, however many requests carried it\n"+
		"$ aws dynamodb scan%s --table-name %s --projection-expression idempotency_key --filter-expression 'idempotency_key IN (:k1, :k2, :k3)' ...\n",
		at, s.orders)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := s.countOrders(ctx, keys)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("scanning the orders table: %w", err))...)
	}
	for _, key := range keys {
		fmt.Fprintf(out, "%s | %d\n", key, n[key])
		if n[key] != 1 {
			errs = append(errs, fmt.Errorf("key %s has %d orders, want 1", key, n[key]))
		}
	}
	return errors.Join(errs...)
}

// countOrders counts the orders of each of keys (the client's
// Idempotency-Key, the attribute idempotency_key), by a strongly
// consistent Scan of the whole orders table: a demo's check on a local
// table, not a query for a large one.
func (s *service) countOrders(ctx context.Context, keys []string) (map[string]int, error) {
	values := make(map[string]types.AttributeValue, len(keys))
	var refs []string
	for i, k := range keys {
		ref := fmt.Sprintf(":k%d", i+1)
		refs = append(refs, ref)
		values[ref] = &types.AttributeValueMemberS{Value: k}
	}
	p := dynamodb.NewScanPaginator(s.db, &dynamodb.ScanInput{
		TableName:                 aws.String(s.orders),
		ProjectionExpression:      aws.String("#k"),
		FilterExpression:          aws.String("#k IN (" + strings.Join(refs, ", ") + ")"),
		ExpressionAttributeNames:  map[string]string{"#k": attrKey},
		ExpressionAttributeValues: values,
		ConsistentRead:            aws.Bool(true),
	})
	n := make(map[string]int, len(keys))
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, err
		}
		for _, it := range page.Items {
			if k, ok := it[attrKey].(*types.AttributeValueMemberS); ok {
				n[k.Value]++
			}
		}
	}
	return n, nil
}
