package dynamostore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
)

// ErrTable is wrapped by the error of [Store.Ping] when the table is
// missing (a wrong name, region or account), not active, or not keyed as
// the store needs (see Table in the package documentation).
var ErrTable = errors.New("dynamostore: table not usable")

// Ping checks that the store's table exists, in the client's region and
// account, is active, and has the store's key schema: one DescribeTable.
// Call it at startup, so that a missing table or a wrong region is a
// clear error there rather than a 503 on every request. Its error wraps
// [ErrTable] for a table that is missing, not active or keyed otherwise;
// otherwise it is DynamoDB's (credentials, network, permissions:
// dynamodb:DescribeTable).
func (s *Store) Ping(ctx context.Context) error {
	out, err := s.db.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: s.table})
	if rnf := (*types.ResourceNotFoundException)(nil); errors.As(err, &rnf) {
		return fmt.Errorf("%w: %s does not exist in this region and account (%v)", ErrTable, *s.table, err)
	}
	if err != nil {
		return fmt.Errorf("dynamostore: describing table %s: %w", *s.table, err)
	}
	return checkTable(out.Table)
}

// checkTable reports whether a table described is active and keyed by
// the store's partition key alone, a string.
func checkTable(t *types.TableDescription) error {
	if t == nil {
		return fmt.Errorf("%w: DescribeTable answered no table", ErrTable)
	}
	name := aws.ToString(t.TableName)
	switch t.TableStatus {
	case types.TableStatusActive, types.TableStatusUpdating:
	default:
		return fmt.Errorf("%w: %s is %s, not ACTIVE", ErrTable, name, t.TableStatus)
	}
	if len(t.KeySchema) != 1 || aws.ToString(t.KeySchema[0].AttributeName) != attrKey || t.KeySchema[0].KeyType != types.KeyTypeHash {
		return fmt.Errorf("%w: %s must have the partition key %q alone, no sort key", ErrTable, name, attrKey)
	}
	for _, d := range t.AttributeDefinitions {
		if aws.ToString(d.AttributeName) == attrKey && d.AttributeType != types.ScalarAttributeTypeS {
			return fmt.Errorf("%w: %s's partition key %q must be a string (S), not %s", ErrTable, name, attrKey, d.AttributeType)
		}
	}
	return nil
}

// CreateTable creates the store's table unless it exists (see Table in
// the package documentation: partition key "id", a string; on-demand
// capacity), waits until it is active (at most two minutes), and enables
// DynamoDB's TTL on the attribute "ttl" unless it is on. It is for tests
// and quick starts: a production table belongs in the infrastructure's
// code (the CloudFormation and Terraform of the package documentation).
// Instances that call it together are safe: the one that loses the race
// waits for the table the other created. An API without the TTL
// operations (dynalite) leaves the table without TTL: expired items stay,
// treated as absent. The caller needs dynamodb:CreateTable,
// DescribeTable, DescribeTimeToLive and UpdateTimeToLive.
func (s *Store) CreateTable(ctx context.Context) error {
	_, err := s.db.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            s.table,
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String(attrKey), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String(attrKey), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	})
	if riu := (*types.ResourceInUseException)(nil); err != nil && !errors.As(err, &riu) {
		return fmt.Errorf("dynamostore: creating table %s: %w", *s.table, err)
	}
	w := dynamodb.NewTableExistsWaiter(s.db, func(o *dynamodb.TableExistsWaiterOptions) {
		o.MinDelay, o.MaxDelay = 50*time.Millisecond, 2*time.Second
	})
	out, err := w.WaitForOutput(ctx, &dynamodb.DescribeTableInput{TableName: s.table}, 2*time.Minute)
	if err != nil {
		return fmt.Errorf("dynamostore: waiting for table %s: %w", *s.table, err)
	}
	if err := checkTable(out.Table); err != nil {
		return err
	}
	ttl, err := s.db.DescribeTimeToLive(ctx, &dynamodb.DescribeTimeToLiveInput{TableName: s.table})
	if err != nil {
		return fmt.Errorf("dynamostore: describing the TTL of %s: %w", *s.table, err)
	}
	if d := ttl.TimeToLiveDescription; d != nil && aws.ToString(d.AttributeName) == attrTTL &&
		(d.TimeToLiveStatus == types.TimeToLiveStatusEnabled || d.TimeToLiveStatus == types.TimeToLiveStatusEnabling) {
		return nil
	}
	_, err = s.db.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{
		TableName:               s.table,
		TimeToLiveSpecification: &types.TimeToLiveSpecification{AttributeName: aws.String(attrTTL), Enabled: aws.Bool(true)},
	})
	if err != nil && !unknownOperation(err) {
		return fmt.Errorf("dynamostore: enabling TTL on %s: %w", *s.table, err)
	}
	return nil
}

// unknownOperation reports whether err says the API does not know the
// operation (dynalite answers UpdateTimeToLive so).
func unknownOperation(err error) bool {
	var ae smithy.APIError
	return errors.As(err, &ae) && ae.ErrorCode() == "UnknownOperationException"
}

// tooLarge reports whether err is DynamoDB refusing an item over its size
// limit: a ValidationException that says so.
func tooLarge(err error) bool {
	var ae smithy.APIError
	if !errors.As(err, &ae) || ae.ErrorCode() != "ValidationException" {
		return false
	}
	m := strings.ToLower(ae.ErrorMessage())
	return strings.Contains(m, "item size") && strings.Contains(m, "exceeded")
}
