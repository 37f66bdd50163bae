package dynamotest

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// client is the tests' HTTP client: no proxy, and no connection kept
// (leakcheck would see its goroutines).
var client = &http.Client{
	Timeout:   10 * time.Second,
	Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true},
}

// request returns a request of the DynamoDB operation op (ListTables,
// PutItem...) with a JSON body, to endpoint. Without an AWS SDK it is
// not signed, but it carries an Authorization header of the form of a
// signature, which is all that dynalite (and DynamoDB Local) check.
func request(endpoint, op, body string) *http.Request {
	req, err := http.NewRequest(http.MethodPost, endpoint, strings.NewReader(body))
	if err != nil {
		panic(err)
	}
	now := time.Now().UTC()
	req.Header.Set("X-Amz-Target", "DynamoDB_20120810."+op)
	req.Header.Set("Content-Type", "application/x-amz-json-1.0")
	req.Header.Set("X-Amz-Date", now.Format("20060102T150405Z"))
	req.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential=idem/"+now.Format("20060102")+
		"/us-east-1/dynamodb/aws4_request, SignedHeaders=host;x-amz-date;x-amz-target, Signature=00")
	return req
}

// call sends op with body to endpoint by c and returns the answer's
// status and body.
func call(c *http.Client, endpoint, op, body string) (int, string, error) {
	resp, err := c.Do(request(endpoint, op, body))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// mustCall calls op and fails the test unless it is answered 200; it
// returns the answer's body.
func mustCall(t testing.TB, endpoint, op, body string) string {
	t.Helper()
	status, out, err := call(client, endpoint, op, body)
	if err != nil || status != http.StatusOK {
		t.Fatalf("%s %s: %d %s, %v; want 200", op, body, status, out, err)
	}
	return out
}

// createTable creates table, with a string key id, and waits until it is
// ACTIVE, as an SDK's waiter would: dynalite answers CreateTable with
// CREATING, as DynamoDB does, and with --createTableMs 0 makes the table
// ACTIVE right after, so that the first DescribeTable sees it ACTIVE.
func createTable(t testing.TB, endpoint, table string) {
	t.Helper()
	mustCall(t, endpoint, "CreateTable", `{"TableName":"`+table+`",`+
		`"AttributeDefinitions":[{"AttributeName":"id","AttributeType":"S"}],`+
		`"KeySchema":[{"AttributeName":"id","KeyType":"HASH"}],"BillingMode":"PAY_PER_REQUEST"}`)
	deadline := time.Now().Add(5 * time.Second)
	for {
		out := mustCall(t, endpoint, "DescribeTable", `{"TableName":"`+table+`"}`)
		var d struct{ Table struct{ TableStatus string } }
		if err := json.Unmarshal([]byte(out), &d); err != nil {
			t.Fatalf("DescribeTable answered %s: %v", out, err)
		}
		if d.Table.TableStatus == "ACTIVE" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("table %s not ACTIVE after 5s: %s", table, out)
		}
		time.Sleep(10 * time.Millisecond) // another process: nothing to wait on but time
	}
}

// tables returns the names ListTables answers.
func tables(t testing.TB, endpoint string) []string {
	t.Helper()
	var l struct{ TableNames []string }
	if out := mustCall(t, endpoint, "ListTables", `{}`); json.Unmarshal([]byte(out), &l) != nil {
		t.Fatalf("ListTables answered %s", out)
	}
	return l.TableNames
}

// TestEndpoint starts the shared server (or uses IDEM_DYNAMODB_ENDPOINT)
// and checks that it serves DynamoDB's API: a table created is listed, an
// item put is got. dynalite answers a request without an Authorization
// header with 400 and MissingAuthenticationTokenException.
func TestEndpoint(t *testing.T) {
	endpoint := Endpoint(t)
	if again := Endpoint(t); again != endpoint {
		t.Errorf("Endpoint %q, then %q", endpoint, again)
	}
	table := Table(t)
	createTable(t, endpoint, table)
	if names := tables(t, endpoint); !slices.Contains(names, table) {
		t.Errorf("ListTables %v, want %s among them", names, table)
	}
	mustCall(t, endpoint, "PutItem", `{"TableName":"`+table+`","Item":{"id":{"S":"k"},"v":{"S":"x"}}}`)
	if out := mustCall(t, endpoint, "GetItem", `{"TableName":"`+table+`","Key":{"id":{"S":"k"}}}`); !strings.Contains(out, `"v":{"S":"x"}`) {
		t.Errorf("GetItem answered %s, want the item put", out)
	}

	if os.Getenv(EnvEndpoint) != "" {
		return // the rest is about dynamotest's own server
	}
	if !strings.HasPrefix(endpoint, "http://127.0.0.1:") {
		t.Errorf("Endpoint %q", endpoint)
	}
	req := request(endpoint, "ListTables", "{}")
	req.Header.Del("Authorization")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "MissingAuthenticationTokenException") {
		t.Errorf("unsigned ListTables: %s %s; want 400, MissingAuthenticationTokenException", resp.Status, b)
	}
	shared.mu.Lock()
	dir, args := shared.srv.dir, shared.srv.cmd.Args
	shared.mu.Unlock()
	if _, err := os.Stat(dir); err != nil {
		t.Error(err)
	}
	if slices.Contains(args, "--path") {
		t.Errorf("the shared server's arguments %v: want it in memory", args)
	}
}

// TestTable: names of DynamoDB's form, a new one each time.
func TestTable(t *testing.T) {
	a, b := Table(t), Table(t)
	if re := regexp.MustCompile(`^idem_test_[0-9a-f]{16}$`); !re.MatchString(a) || !re.MatchString(b) || a == b {
		t.Errorf("Table: %q, %q; want two idem_test_ and 16 hex digits", a, b)
	}
}

// TestProcKillStart: a connection to a Proc's server breaks at Kill, new
// ones are refused while it is down, Start serves again on the same
// endpoint with the tables and items written before Kill, and the
// server's directory is gone when the test ends.
func TestProcKillStart(t *testing.T) {
	var dir string
	t.Run("proc", func(t *testing.T) {
		p := StartProc(t)
		p.mu.Lock()
		dir, args := p.srv.dir, p.srv.cmd.Args
		p.mu.Unlock()
		shared.mu.Lock()
		if shared.srv != nil && shared.srv.dir == dir {
			t.Error("StartProc returned the shared server")
		}
		shared.mu.Unlock()
		if i := slices.Index(args, "--path"); i < 0 || i+1 == len(args) || args[i+1] != dir+"/data" {
			t.Errorf("dynalite %v: want --path %s/data", args, dir)
		}
		endpoint := p.Endpoint()

		table := Table(t)
		createTable(t, endpoint, table)
		mustCall(t, endpoint, "PutItem", `{"TableName":"`+table+`","Item":{"id":{"S":"k"},"v":{"S":"before the kill"}}}`)
		c, r := dial(t, endpoint)
		defer c.Close()
		if err := listOn(c, r, endpoint); err != nil {
			t.Fatalf("ListTables before the kill: %v", err)
		}
		p.Kill()
		broken(t, c, r, endpoint)
		if status, _, err := call(client, endpoint, "ListTables", "{}"); err == nil {
			t.Fatalf("the killed server answered %d", status)
		}

		p.Start()
		if p.Endpoint() != endpoint {
			t.Errorf("Endpoint after the restart %q, want %q", p.Endpoint(), endpoint)
		}
		if names := tables(t, endpoint); !slices.Equal(names, []string{table}) {
			t.Errorf("ListTables after the restart: %v, want [%s]", names, table)
		}
		if out := mustCall(t, endpoint, "GetItem", `{"TableName":"`+table+`","Key":{"id":{"S":"k"}}}`); !strings.Contains(out, "before the kill") {
			t.Errorf("GetItem after the restart answered %s, want the item put before the kill", out)
		}
		mustCall(t, endpoint, "PutItem", `{"TableName":"`+table+`","Item":{"id":{"S":"k2"}}}`)

		// Twice, to see Kill and Start of a restarted server.
		c2, r2 := dial(t, endpoint)
		defer c2.Close()
		if err := listOn(c2, r2, endpoint); err != nil {
			t.Fatalf("ListTables after the restart: %v", err)
		}
		p.Kill()
		broken(t, c2, r2, endpoint)
		p.Start()
		if out := mustCall(t, endpoint, "GetItem", `{"TableName":"`+table+`","Key":{"id":{"S":"k2"}}}`); !strings.Contains(out, "k2") {
			t.Errorf("GetItem after the second restart answered %s, want the item put before it", out)
		}
	})
	if dir == "" {
		return // skipped
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the Proc's directory %s after its test: %v, want it removed", dir, err)
	}
}

// TestProcPause: a paused server takes requests and answers none; once
// resumed it answers; Kill works on a paused server, and a server paused
// at the end of its test is stopped and its directory removed.
func TestProcPause(t *testing.T) {
	var dir string
	t.Run("proc", func(t *testing.T) {
		p := StartProc(t)
		p.mu.Lock()
		dir = p.srv.dir
		p.mu.Unlock()
		endpoint := p.Endpoint()
		short := &http.Client{Timeout: 300 * time.Millisecond, Transport: client.Transport}

		p.Pause()
		status, out, err := call(short, endpoint, "ListTables", "{}")
		if ne := net.Error(nil); !errors.As(err, &ne) || !ne.Timeout() {
			t.Errorf("ListTables of a paused server: %d %s, %v; want a timeout", status, out, err)
		}
		p.Resume()
		mustCall(t, endpoint, "ListTables", "{}")

		p.Pause()
		p.Kill()
		p.Start()
		mustCall(t, endpoint, "ListTables", "{}")
		p.Pause() // and the test ends
	})
	if dir == "" {
		return // skipped
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the Proc's directory %s after its test: %v, want it removed", dir, err)
	}
}

// dial opens a connection to endpoint, for requests kept alive on it.
func dial(t testing.TB, endpoint string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(endpoint, "http://"), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return c, bufio.NewReader(c)
}

// listOn sends ListTables on c and reads its answer.
func listOn(c net.Conn, r *bufio.Reader, endpoint string) error {
	c.SetDeadline(time.Now().Add(10 * time.Second))
	req := request(endpoint, "ListTables", "{}")
	if err := req.Write(c); err != nil {
		return err
	}
	resp, err := http.ReadResponse(r, req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s %s", resp.Status, b)
	}
	return err
}

// broken checks that c, a connection of a killed server, is broken: a
// request on it fails at once, not for want of an answer.
func broken(t testing.TB, c net.Conn, r *bufio.Reader, endpoint string) {
	t.Helper()
	err := listOn(c, r, endpoint)
	var ne net.Error
	switch {
	case err == nil:
		t.Fatal("a connection of the killed server still answers")
	case errors.As(err, &ne) && ne.Timeout():
		t.Fatalf("a connection of the killed server: %v, want it broken", err)
	}
}
