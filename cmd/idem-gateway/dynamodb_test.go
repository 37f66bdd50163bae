package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/idemkit/idem/internal/dynamotest"
)

// noAWSEnvironment is the environment of a gateway that must find no AWS
// region, credentials, profile or configuration file of the machine's:
// the defaults for an endpoint (us-east-1, dummy credentials) apply.
func noAWSEnvironment(t *testing.T) []string {
	env := []string{"AWS_EC2_METADATA_DISABLED=true",
		"AWS_CONFIG_FILE=" + filepath.Join(t.TempDir(), "config"),
		"AWS_SHARED_CREDENTIALS_FILE=" + filepath.Join(t.TempDir(), "credentials")}
	for _, v := range append([]string{"AWS_REGION", "AWS_DEFAULT_REGION", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
		"AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_DYNAMODB"}, credentialVars...) {
		env = append(env, v+"=")
	}
	return env
}

// dynamoConfig is a gateway in front of up, on the DynamoDB table at
// endpoint, declared with extra.
func dynamoConfig(up *upstream, endpoint, table, extra string) string {
	return fmt.Sprintf(`instances: 2
listen: [{address: "127.0.0.1:0"}]
admin: {address: "127.0.0.1:0"}
store:
  dynamodb: {table: %s, endpoint: %q%s}
upstreams: {app: {url: %q}}
routes:
  - {match: "POST /orders", upstream: app, scope: {authorization: true}}
`, table, endpoint, extra, up.URL)
}

// On DynamoDB (dynalite): create_table creates the table at start; a
// keyed POST reaches the upstream once, and its retry, through a second
// gateway on the same table, gets the stored response; /readyz answers.
func TestProcessDynamoDB(t *testing.T) {
	endpoint := dynamotest.Endpoint(t)
	table := dynamotest.Table(t)
	up := newUpstream(t)
	config := dynamoConfig(up, endpoint, table, ", create_table: true")
	env := noAWSEnvironment(t)
	a := startGateway(t, config, env...)
	b := startGateway(t, config, env...) // the table exists: created again is no error
	ctx := deadline(t, time.Minute)
	c := &http.Client{}
	first := post(ctx, c, a.url("/orders"), "ddb", `{"item":"book"}`)
	again := settled(ctx, c, b.url("/orders"), "ddb", `{"item":"book"}`)
	if first.status != http.StatusCreated || first.replayed || !again.replayed || again.body != first.body ||
		again.header.Get("X-Execution") != first.header.Get("X-Execution") || up.ran("ddb") != 1 {
		t.Fatalf("%v then %v; the upstream ran %d times; want 201 once, then the same bytes replayed", first, again, up.ran("ddb"))
	}
	if a := post(ctx, c, a.url("/orders"), "ddb", `{"item":"pen"}`); a.status != http.StatusUnprocessableEntity {
		t.Fatalf("the key with another body: %v, want 422", a)
	}
	for _, gw := range []*proc{a, b} {
		res, err := c.Get("http://" + gw.admin + "/readyz")
		if err != nil || res.StatusCode != http.StatusOK {
			t.Fatalf("/readyz: %v %v", res, err)
		}
		res.Body.Close()
		gw.waitLog(t, "dynamodb table ready", time.Second, "table", table, "region", "us-east-1")
	}
}

// A table that does not exist, without create_table: the gateway does
// not start, exits 1, and says which table, in which region, and what to
// do.
func TestProcessDynamoDBMissingTable(t *testing.T) {
	endpoint := dynamotest.Endpoint(t)
	table := dynamotest.Table(t)
	up := newUpstream(t)
	for _, c := range []struct{ extra, region string }{{"", "us-east-1"}, {", region: eu-west-1", "eu-west-1"}} {
		file := filepath.Join(t.TempDir(), "gateway.yaml")
		if err := os.WriteFile(file, []byte(dynamoConfig(up, endpoint, table, c.extra)), 0o600); err != nil {
			t.Fatal(err)
		}
		p := launch(t, file, noAWSEnvironment(t)...)
		if code := p.wait(t, time.Minute); code != 1 {
			t.Fatalf("exit code %d, want 1:\n%s", code, strings.Join(p.lines(), "\n"))
		}
		out := strings.Join(p.lines(), "\n")
		want := "store.dynamodb: region " + c.region + " at " + endpoint + ": dynamostore: table not usable: " + table + " does not exist"
		if !strings.Contains(out, want) || !strings.Contains(out, "create_table: true") || p.count("store not reachable yet; retrying") != 0 {
			t.Errorf("the log lacks %q and the hint, or retried:\n%s", want, out)
		}
	}
	if up.executions() != 0 {
		t.Errorf("the upstream ran %d times", up.executions())
	}
}

// Without an endpoint, the region comes from the file or the AWS SDK's
// configuration, and a gateway that finds none does not start.
func TestProcessDynamoDBNoRegion(t *testing.T) {
	up := newUpstream(t)
	file := filepath.Join(t.TempDir(), "gateway.yaml")
	config := strings.Replace(dynamoConfig(up, "", "orders_idem", ""), `, endpoint: ""`, "", 1)
	if err := os.WriteFile(file, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	p := launch(t, file, noAWSEnvironment(t)...)
	if code := p.wait(t, time.Minute); code != 1 {
		t.Fatalf("exit code %d, want 1:\n%s", code, strings.Join(p.lines(), "\n"))
	}
	if out := strings.Join(p.lines(), "\n"); !strings.Contains(out, "store.dynamodb: no AWS region: declare region, or set AWS_REGION") {
		t.Errorf("the log lacks the missing region:\n%s", out)
	}
}

// With an endpoint, the credentials are dummy ones unless the environment
// names some, or the endpoint is AWS's own; the region is the file's,
// else the environment's, else us-east-1 with an endpoint and none
// without.
func TestAWSConfig(t *testing.T) {
	for _, kv := range noAWSEnvironment(t) {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	load := func(region, endpoint string) (string, string, error) {
		t.Helper()
		cfg, err := awsConfig(t.Context(), region, endpoint, awshttp.NewBuildableClient())
		if err != nil {
			t.Fatal(err)
		}
		creds, err := cfg.Credentials.Retrieve(t.Context())
		return cfg.Region, creds.AccessKeyID, err
	}
	local := "http://127.0.0.1:8000"
	if region, key, err := load("", local); region != "us-east-1" || err != nil || key != "idem" {
		t.Errorf("an endpoint, nothing in the environment: region %q, key %q (%v); want us-east-1 and dummy credentials", region, key, err)
	}
	if region, _, _ := load("eu-west-1", local); region != "eu-west-1" {
		t.Errorf("region: eu-west-1 with an endpoint: region %q", region)
	}
	if region, _, _ := load("", ""); region != "" {
		t.Errorf("no endpoint, nothing in the environment: region %q, want none", region)
	}
	if _, key, err := load("", "https://dynamodb.eu-west-1.amazonaws.com"); err == nil && key == "idem" {
		t.Errorf("an endpoint of AWS's: dummy credentials, want the default chain's (none here)")
	}
	t.Setenv("AWS_REGION", "ap-south-1")
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDGATEWAY")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "gateway-secret")
	if region, key, err := load("", local); region != "ap-south-1" || err != nil || key != "AKIDGATEWAY" {
		t.Errorf("an endpoint, AWS_REGION and keys in the environment: region %q, key %q (%v); want the environment's", region, key, err)
	}
	if region, _, _ := load("eu-west-1", ""); region != "eu-west-1" {
		t.Errorf("region: eu-west-1 over AWS_REGION: region %q", region)
	}
}
