package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/idemkit/idem/storage/dynamostore"
)

// localRegion is the region of a client of an -endpoint when no region is
// given anywhere: DynamoDB Local and dynalite take any.
const localRegion = "us-east-1"

// credentialVars are the environment variables through which the SDK's
// default chain finds credentials of the operator's: keys, a profile, a
// web identity (EKS), a container's (ECS).
var credentialVars = []string{
	"AWS_ACCESS_KEY_ID", "AWS_ACCESS_KEY", "AWS_PROFILE", "AWS_DEFAULT_PROFILE",
	"AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
}

// dummyCredentials sign the requests to an -endpoint when the environment
// names no credentials: DynamoDB Local and dynalite want a signature but
// check none.
var dummyCredentials = aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
	return aws.Credentials{AccessKeyID: "idem", SecretAccessKey: "idem", Source: "idemctl: dummy credentials for -endpoint"}, nil
})

// awsConfig loads the SDK's configuration as config.LoadDefaultConfig
// does (the environment, then the shared files; region wins over both),
// with the HTTP client hc. With an endpoint that is not AWS's own, the
// region defaults to us-east-1, and the credentials are dummy ones unless
// the environment names some. Its region is "" when none is found
// anywhere and there is no endpoint.
func awsConfig(ctx context.Context, region, endpoint string, hc *awshttp.BuildableClient) (aws.Config, error) {
	opts := []func(*config.LoadOptions) error{config.WithHTTPClient(hc)}
	if region != "" {
		opts = append(opts, config.WithRegion(region))
	}
	local := endpoint != "" && !awsEndpoint(endpoint)
	if local && !credentialsInEnv() {
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

// checkDynamoDB checks -dynamodb's table and -endpoint.
func checkDynamoDB(table, endpoint string) error {
	if !validTable(table) {
		return usageError("-dynamodb %q is not a DynamoDB table: 3 to 255 letters, digits, _, - and ., or a table's ARN", table)
	}
	if endpoint == "" {
		return nil
	}
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return usageError("-endpoint %q is not the URL of a DynamoDB API: http://host:port (DynamoDB Local: http://localhost:8000)", endpoint)
	}
	return nil
}

// openDynamoDB opens the DynamoDB store, and checks its table with a
// DescribeTable (Store.Ping): a missing table, or a table in another
// region or account, is an error here rather than "no such entry".
func (c *cli) openDynamoDB(ctx context.Context) (closeStore func(), err error) {
	// The SDK's HTTP client, as it tunes it (AWS_CA_BUNDLE, timeouts),
	// whose connections close with the store.
	var cs conns
	hc := awshttp.NewBuildableClient().WithTransportOptions(func(tr *http.Transport) {
		tr.DialContext = cs.dial(tr.DialContext)
	})
	defer func() {
		if err != nil {
			cs.closeAll()
		}
	}()
	cfg, err := awsConfig(ctx, c.region, c.endpoint, hc)
	if err != nil {
		return nil, fmt.Errorf("-dynamodb: loading the AWS configuration: %w", err)
	}
	if cfg.Region == "" {
		return nil, usageError("-dynamodb: no AWS region: give -region, or set AWS_REGION (or a region in the AWS profile)")
	}
	client := dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) {
		if c.endpoint != "" {
			o.BaseEndpoint = aws.String(c.endpoint)
		}
	})
	store, err := dynamostore.New(client, dynamostore.WithTable(c.dynamodb))
	if err != nil {
		return nil, usageError("-dynamodb: %v", err)
	}
	if err := store.Ping(ctx); err != nil {
		where := "region " + cfg.Region
		if c.endpoint != "" {
			where += " at " + c.endpoint
		}
		return nil, c.storeError(fmt.Errorf("%s: %w", where, err))
	}
	c.store = store
	return cs.closeAll, nil
}

// conns are the connections a client dialed and has not closed.
type conns struct {
	mu   sync.Mutex
	open map[*trackedConn]bool
}

// dial returns dial (the default dialer's when nil) with its connections
// kept in cs.
func (cs *conns) dial(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		tc := &trackedConn{Conn: conn, cs: cs}
		cs.mu.Lock()
		if cs.open == nil {
			cs.open = map[*trackedConn]bool{}
		}
		cs.open[tc] = true
		cs.mu.Unlock()
		return tc, nil
	}
}

// closeAll closes the connections still open.
func (cs *conns) closeAll() {
	cs.mu.Lock()
	open := cs.open
	cs.open = nil
	cs.mu.Unlock()
	for tc := range open {
		tc.Conn.Close()
	}
}

// trackedConn is a connection that leaves its conns when closed.
type trackedConn struct {
	net.Conn
	cs *conns
}

func (tc *trackedConn) Close() error {
	tc.cs.mu.Lock()
	delete(tc.cs.open, tc)
	tc.cs.mu.Unlock()
	return tc.Conn.Close()
}
