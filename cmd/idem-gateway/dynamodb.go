package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/dynamostore"
)

// localRegion is the region of a client of an endpoint when no region is
// declared or found anywhere: DynamoDB Local and dynalite take any.
const localRegion = "us-east-1"

// credentialVars are the environment variables through which the AWS
// SDK's default chain finds credentials: keys, a profile, a web identity
// (EKS), a container's (ECS).
var credentialVars = []string{
	"AWS_ACCESS_KEY_ID", "AWS_ACCESS_KEY", "AWS_PROFILE", "AWS_DEFAULT_PROFILE",
	"AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
}

// dummyCredentials sign the requests to an endpoint when the environment
// names no credentials: DynamoDB Local and dynalite want a signature but
// check none.
var dummyCredentials = aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
	return aws.Credentials{AccessKeyID: "idem", SecretAccessKey: "idem", Source: "idem-gateway: dummy credentials for store.dynamodb.endpoint"}, nil
})

// regionName is the form of an AWS region's name.
var regionName = regexp.MustCompile(`^[a-z]{2,}(-[a-z0-9]+)+$`)

// tableName is a DynamoDB table's name.
var tableName = regexp.MustCompile(`^[A-Za-z0-9_.-]{3,255}$`)

// validTable reports whether DynamoDB takes table as a table: a name, or
// a table's ARN (a table of another account, shared by a resource-based
// policy).
func validTable(table string) bool {
	if arn, ok := strings.CutPrefix(table, "arn:"); ok {
		return len(table) <= 1024 && arn != "" && !strings.ContainsAny(arn, " \t\r\n")
	}
	return tableName.MatchString(table)
}

// awsConfig loads the AWS SDK's configuration as config.LoadDefaultConfig
// does (the environment, then the shared files; region wins over both),
// with the HTTP client hc. With an endpoint that is not AWS's own, the
// region defaults to us-east-1, and the credentials to dummy ones unless
// the environment names some. Its region is "" when none is found
// anywhere and there is no endpoint.
func awsConfig(ctx context.Context, region, endpoint string, hc *awshttp.BuildableClient) (aws.Config, error) {
	opts := []func(*config.LoadOptions) error{config.WithHTTPClient(hc)}
	if region != "" {
		opts = append(opts, config.WithRegion(region))
	}
	if endpoint != "" && !awsEndpoint(endpoint) && !credentialsInEnv() {
		opts = append(opts, config.WithCredentialsProvider(dummyCredentials))
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return aws.Config{}, err
	}
	if cfg.Region == "" && endpoint != "" {
		cfg.Region = localRegion
	}
	return cfg, nil
}

// credentialsInEnv reports whether the environment names credentials.
func credentialsInEnv() bool {
	for _, v := range credentialVars {
		if os.Getenv(v) != "" {
			return true
		}
	}
	return false
}

// awsEndpoint reports whether endpoint is one of AWS's own (a VPC or a
// FIPS endpoint), which the default credentials always sign for.
func awsEndpoint(endpoint string) bool {
	u, err := url.Parse(endpoint)
	if err != nil {
		return false
	}
	h := strings.ToLower(u.Hostname())
	for _, d := range []string{".amazonaws.com", ".amazonaws.com.cn", ".api.aws"} {
		if strings.HasSuffix(h, d) {
			return true
		}
	}
	return false
}

// readyKey is the key /readyz looks up: never a storage key (those are
// hashes), so never found, which is the answer it wants.
const readyKey = "idem-gateway:readyz"

// openDynamoDB opens the DynamoDB store, and checks its table
// (Store.Ping: a DescribeTable), or creates it with create_table. A table
// that is missing, or keyed otherwise, stops the gateway at once; any
// other failure (the network, credentials not there yet, permissions not
// yet propagated) is tried again, as for the other stores.
func openDynamoDB(ctx context.Context, c *DynamoDBStore, log *slog.Logger) (*openedStore, error) {
	// The SDK's HTTP client, keeping more idle connections than its 10
	// to the one host, for the gateway's concurrent requests.
	hc := awshttp.NewBuildableClient().WithTransportOptions(func(tr *http.Transport) {
		tr.MaxIdleConnsPerHost = 100
	})
	cfg, err := awsConfig(ctx, c.Region, c.Endpoint, hc)
	if err != nil {
		return nil, fmt.Errorf("dynamodb: loading the AWS configuration: %w", err)
	}
	if cfg.Region == "" {
		return nil, errors.New("store.dynamodb: no AWS region: declare region, or set AWS_REGION (or a region in the AWS profile)")
	}
	client := dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) {
		if c.Endpoint != "" {
			o.BaseEndpoint = aws.String(c.Endpoint)
		}
	})
	st, err := dynamostore.New(client, dynamostore.WithTable(c.Table))
	if err != nil {
		return nil, fmt.Errorf("dynamodb: %w", err)
	}
	where := "region " + cfg.Region
	if c.Endpoint != "" {
		where += " at " + c.Endpoint
	}
	check := func() error {
		var err error
		if c.CreateTable {
			ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
			defer cancel()
			err = st.CreateTable(ctx)
		} else {
			ctx, cancel := context.WithTimeout(ctx, max(c.Timeout, 10*time.Second))
			defer cancel()
			err = st.Ping(ctx)
		}
		if errors.Is(err, dynamostore.ErrTable) {
			return permanent{err}
		}
		return err
	}
	if err := retry(ctx, log, "dynamodb", check); err != nil {
		hint := ""
		if errors.Is(err, dynamostore.ErrTable) && !c.CreateTable {
			hint = " (create it as dynamostore's documentation shows: partition key id, a string, no sort key; or declare create_table: true for a quick start)"
		}
		return nil, fmt.Errorf("store.dynamodb: %s: %w%s", where, err, hint)
	}
	log.Info("dynamodb table ready", "table", c.Table, "region", cfg.Region)
	return &openedStore{
		Store: st,
		kind:  "dynamodb",
		// A look-up (a GetItem), not a DescribeTable: DynamoDB asks
		// that its control plane not be polled.
		ping: func(ctx context.Context) error {
			_, err := st.Lookup(ctx, readyKey, false)
			if errors.Is(err, storage.ErrNotFound) {
				return nil
			}
			return err
		},
		// The SDK's client holds nothing but idle connections, which the
		// process's exit closes.
		close: func() {},
	}, nil
}
