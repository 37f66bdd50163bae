package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/democlient"
	"github.com/idemkit/idem/examples/internal/demotest"
	"github.com/idemkit/idem/internal/dynamotest"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/dynamostore"
)

// The tests run the service on dynalite (internal/dynamotest: one server
// for the test binary, or IDEM_DYNAMODB_ENDPOINT), each on tables of its
// own.

// testConfig is the config of a run on the tests' DynamoDB API, with
// tables of the test's own.
func testConfig(t *testing.T) config {
	return config{endpoint: dynamotest.Endpoint(t), table: dynamotest.Table(t), orders: dynamotest.Table(t), create: true}
}

// TestDemo runs what `go run ./examples/dynamodb -endpoint ... -demo`
// runs, twice on the same tables, as two runs of the command on one
// DynamoDB: the first creates the tables, the second finds them. Each
// transcript shows the promised answers, and one order per key.
func TestDemo(t *testing.T) {
	c := testConfig(t)
	c.demo = true
	rowRE := regexp.MustCompile(`(?m)^order-([123])-([0-9a-f]{8}) \| 1$`)
	for i := range 2 {
		var out, logw demotest.Buffer
		if err := run(c, &out, &logw); err != nil {
			t.Fatalf("run %d: %v\ntranscript:\n%s\nlog:\n%s", i, err, out.String(), logw.String())
		}
		got := out.String()
		sections := transcript(got)
		first, retry := sections["first call: the handler runs"], sections["the client retries: replayed, the handler does not run again"]
		if !strings.Contains(first, "HTTP 201") || !strings.Contains(retry, "HTTP 201  Idempotent-Replayed: true") {
			t.Errorf("run %d: the first call and its retry:\n%s\n%s", i, first, retry)
		}
		if body := lastLine(first); !regexp.MustCompile(`^\{"order":"[A-Za-z0-9_-]{22}","item":"book","amount":12,"created_at":"[^"]+Z"\}$`).MatchString(body) || lastLine(retry) != body {
			t.Errorf("run %d: the order %q and its replay %q, want the same order", i, body, lastLine(retry))
		}
		for _, want := range []string{"HTTP 422", "HTTP 409", fmt.Sprintf("%d identical requests at once", duplicates),
			"$ aws dynamodb scan --endpoint-url " + c.endpoint + " --table-name " + c.orders} {
			if !strings.Contains(got, want) {
				t.Errorf("run %d: the transcript does not show %q:\n%s", i, want, got)
			}
		}
		rows := rowRE.FindAllStringSubmatch(got, -1)
		if len(rows) != 3 || rows[0][2] != rows[1][2] || rows[1][2] != rows[2][2] {
			t.Errorf("run %d: want one row for each of the run's 3 keys:\n%s", i, got)
		}
		// One execution per key: the first order, the double click, the burst.
		if n := strings.Count(logw.String(), "-> executed 201"); n != 3 {
			t.Errorf("run %d: %d executions, want 3; log:\n%s", i, n, logw.String())
		}
	}
	a := newAppOn(t, c)
	if n := a.countAll(); n != 6 {
		t.Errorf("%d orders after two runs, want 6", n)
	}
}

// TestMissingTable: without -create, a missing table stops the service at
// startup with a message that says which table and what to do, before it
// serves anything.
func TestMissingTable(t *testing.T) {
	c := testConfig(t)
	c.create, c.demo = false, true // demo: should it start after all, it ends
	err := run(c, io.Discard, io.Discard)
	for _, want := range []string{"idem's table " + c.table + " at " + c.endpoint, "does not exist", "Pass -create", "CloudFormation or Terraform"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("idem's table missing: %v, want an error saying %q", err, want)
		}
	}

	// idem's table there, the orders' not.
	db, err := connect(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	store, err := dynamostore.New(db, dynamostore.WithTable(c.table))
	if err != nil {
		t.Fatal(err)
	}
	if err := store.CreateTable(t.Context()); err != nil {
		t.Fatal(err)
	}
	err = run(c, io.Discard, io.Discard)
	for _, want := range []string{"the orders table " + c.orders, "does not exist", "Pass -create", "partition key id (S)"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("the orders table missing: %v, want an error saying %q", err, want)
		}
	}
}

// TestConfig: run refuses, with a message that says what to do, table
// names it cannot use and an AWS without a region, before it sends
// anything.
func TestConfig(t *testing.T) {
	if err := run(config{table: "orders", orders: "orders"}, io.Discard, io.Discard); err == nil ||
		!strings.Contains(err.Error(), "idem's table and the orders table are both") {
		t.Errorf("one table for both: %v", err)
	}
	for _, v := range []string{"AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_DEFAULT_PROFILE"} {
		t.Setenv(v, "")
	}
	t.Setenv("AWS_CONFIG_FILE", t.TempDir()+"/none")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", t.TempDir()+"/none")
	if err := run(config{table: "idem_keys", orders: "orders"}, io.Discard, io.Discard); err == nil ||
		!strings.Contains(err.Error(), "no AWS region: give -region") || !strings.Contains(err.Error(), "-endpoint") {
		t.Errorf("AWS without a region: %v, want an error that names -region and -endpoint", err)
	}
}

// TestProcessDiedAfterWrite: the first process writes the order and dies
// before its response is stored. While its lease runs, a retry gets 409
// (in flight); once it has run out (here the entry is removed, as the
// store's expiry would make it absent), the retry runs the handler, whose
// PutItem fails its condition: it answers the order that exists, the
// original 201 byte for byte, and no second order is made. Once idem has
// forgotten the key, the order is still the key's only one.
func TestProcessDiedAfterWrite(t *testing.T) {
	a := newApp(t)
	dying, _ := a.serve(&diesAfterWrite{Store: a.svc.store})
	const key, body = "died", `{"item":"book","amount":12}`
	orig := mustPost(t, dying, key, body)
	if orig.status != http.StatusCreated || orig.replayed() || orig.header.Get("Location") == "" {
		t.Fatalf("first: %d %v %s, want 201 with a Location", orig.status, orig.header, orig.body)
	}
	var o order
	if err := json.Unmarshal(orig.body, &o); err != nil {
		t.Fatal(err)
	}
	skey := o.ID // the order's id is the request's StorageKey
	if e := a.lookup(skey); e.State != storage.InFlight {
		t.Fatalf("idem's entry is %v after the process died, want in flight (no response stored)", e.State)
	}

	base, logw := a.serve(a.svc.store)
	if r := mustPost(t, base, key, body); r.status != http.StatusConflict || !strings.Contains(string(r.body), "#ErrConflict") {
		t.Errorf("a retry while the dead execution's lease runs: %d %s, want 409 ErrConflict", r.status, r.body)
	}
	a.forget(skey) // the lease ran out

	r := mustPost(t, base, key, body)
	if r.status != http.StatusCreated || r.replayed() || !r.same(orig) {
		t.Errorf("the retry: %d %v %q, want the original %d %v %q, executed", r.status, r.header, r.body, orig.status, orig.header, orig.body)
	}
	if !strings.Contains(logw.String(), "-> executed 201") || !strings.Contains(logw.String(), "exists for this key: answered it, created nothing") {
		t.Errorf("want the handler to run and find the order; log:\n%s", logw.String())
	}
	if r := mustPost(t, base, key, body); !r.replayed() || !r.same(orig) {
		t.Errorf("another retry: %d %v %q, want the replay of %q", r.status, r.header, r.body, orig.body)
	}
	if r := mustPost(t, base, key, `{"item":"book","amount":13}`); r.status != http.StatusUnprocessableEntity {
		t.Errorf("the key with another body: %d %s, want 422", r.status, r.body)
	}

	// idem forgets the key (its TTL): the order stays the key's only one,
	// answered again for the same request, and refused for another.
	a.forget(skey)
	if r := mustPost(t, base, key, body); r.status != http.StatusCreated || r.replayed() || !r.same(orig) {
		t.Errorf("the same body once idem forgot the key: %d %s, want the original %s", r.status, r.body, orig.body)
	}
	a.forget(skey)
	if r := mustPost(t, base, key, `{"item":"book","amount":13}`); r.status != http.StatusConflict || r.replayed() ||
		!strings.Contains(string(r.body), "already created") {
		t.Errorf("another body once idem forgot the key: %d %v %s, want 409, an order exists", r.status, r.header, r.body)
	}
	if n := a.count(key); n != 1 {
		t.Errorf("%d orders for the key, want 1", n)
	}

	// The order's Location serves it.
	res, err := http.Get(base + orig.header.Get("Location"))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || !bytes.Equal(got, orig.body) {
		t.Errorf("GET %s: %d %s, want 200 %s", orig.header.Get("Location"), res.StatusCode, got, orig.body)
	}
	res, err = http.Get(base + "/orders/none")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusNotFound {
		t.Errorf("GET /orders/none: %d, want 404", res.StatusCode)
	}
}

// TestOrdersUnavailable: when the handler cannot write the order, the
// client gets 503 with Retry-After and idem stores nothing (it releases
// the key): the retry, once DynamoDB answers, creates the order.
func TestOrdersUnavailable(t *testing.T) {
	a := newApp(t)
	broken := *a.svc
	broken.orders = dynamotest.Table(t) // no such table: every write fails
	down, downLog := a.serveService(&broken, a.svc.store)
	const key, body = "down", `{"item":"book","amount":12}`
	r := mustPost(t, down, key, body)
	if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") != "1" ||
		r.header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("orders table unavailable: %d %v %s, want a 503 problem with Retry-After: 1", r.status, r.header, r.body)
	}
	if !strings.Contains(downLog.String(), "POST /orders: ") {
		t.Errorf("DynamoDB's error is not logged:\n%s", downLog.String())
	}
	up, _ := a.serve(a.svc.store)
	if r := mustPost(t, up, key, body); r.status != http.StatusCreated || r.replayed() {
		t.Errorf("the retry: %d %v %s, want 201, executed", r.status, r.header, r.body)
	}
	if n := a.count(key); n != 1 {
		t.Errorf("%d orders, want 1", n)
	}
}

// The JSON of an order has its item's attributes, and nothing else; read
// back from its item it is the same, byte for byte.
func TestOrderJSON(t *testing.T) {
	o := order{ID: "3q2-7wEjRbCfT0nUTpSPdA", Item: "book", Amount: 12, CreatedAt: time.Date(2025, 6, 1, 10, 0, 0, 123456000, time.UTC)}
	w := httptest.NewRecorder()
	writeOrder(w, http.StatusCreated, o)
	want := `{"order":"3q2-7wEjRbCfT0nUTpSPdA","item":"book","amount":12,"created_at":"2025-06-01T10:00:00.123456Z"}` + "\n"
	if w.Code != http.StatusCreated || w.Body.String() != want || w.Header().Get("Location") != "/orders/3q2-7wEjRbCfT0nUTpSPdA" {
		t.Errorf("%d %v %s, want 201 Location /orders/3q2-7wEjRbCfT0nUTpSPdA %s", w.Code, w.Header(), w.Body, want)
	}
	back, err := parseOrder(o.item())
	if err != nil {
		t.Fatal(err)
	}
	w = httptest.NewRecorder()
	writeOrder(w, http.StatusCreated, back)
	if w.Body.String() != want {
		t.Errorf("read back: %s, want %s", w.Body, want)
	}
	if _, err := parseOrder(map[string]types.AttributeValue{"id": &types.AttributeValueMemberS{Value: "x"}}); err == nil {
		t.Error("an item without its attributes parsed")
	}
}

// app is the service on tables of its own.
type app struct {
	t   *testing.T
	svc *service
}

// newApp opens the service as run does, on tables of the test's own.
func newApp(t *testing.T) *app { return newAppOn(t, testConfig(t)) }

// newAppOn opens the service as run does, with c.
func newAppOn(t *testing.T, c config) *app {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := connect(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := open(ctx, db, c, democlient.NewClicks(), log.New(io.Discard, "", 0))
	if err != nil {
		t.Fatal(err)
	}
	return &app{t: t, svc: svc}
}

// serve serves an instance of the service, whose middleware keeps its
// entries in store, with opts after the service's options, until the test
// ends. It returns its URL and the log of its middleware's decisions and
// DynamoDB's errors.
func (a *app) serve(store storage.Store, opts ...idem.Option) (string, *demotest.Buffer) {
	return a.serveService(a.svc, store, opts...)
}

// serveService is serve for an instance of svc.
func (a *app) serveService(svc *service, store storage.Store, opts ...idem.Option) (string, *demotest.Buffer) {
	a.t.Helper()
	inst := *svc
	logw := new(demotest.Buffer)
	inst.clicks, inst.log = democlient.NewClicks(), log.New(logw, "", 0)
	m, err := idem.New(store, append(inst.options(), opts...)...)
	if err != nil {
		a.t.Fatal(err)
	}
	srv := httptest.NewServer(inst.routes(m))
	a.t.Cleanup(func() {
		srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := m.Shutdown(ctx); err != nil {
			a.t.Error(err)
		}
	})
	return srv.URL, logw
}

// lookup returns idem's entry of the storage key.
func (a *app) lookup(skey string) storage.Entry {
	a.t.Helper()
	e, err := a.svc.store.Lookup(context.Background(), skey, false)
	if err != nil {
		a.t.Fatal(err)
	}
	return e
}

// forget removes idem's entry of the storage key, as the end of its lease
// or of its TTL makes it absent.
func (a *app) forget(skey string) {
	a.t.Helper()
	if _, err := a.svc.store.Remove(context.Background(), skey, a.lookup(skey).Version); err != nil {
		a.t.Fatal(err)
	}
}

// count returns the number of orders of the client's key.
func (a *app) count(key string) int {
	a.t.Helper()
	n, err := a.svc.countOrders(context.Background(), []string{key})
	if err != nil {
		a.t.Fatal(err)
	}
	return n[key]
}

// countAll returns the number of orders in the table.
func (a *app) countAll() int {
	a.t.Helper()
	p := dynamodb.NewScanPaginator(a.svc.db, &dynamodb.ScanInput{TableName: aws.String(a.svc.orders), Select: types.SelectCount})
	n := 0
	for p.HasMorePages() {
		page, err := p.NextPage(context.Background())
		if err != nil {
			a.t.Fatal(err)
		}
		n += int(page.Count)
	}
	return n
}

// diesAfterWrite is the store of a process that dies once its handler has
// returned: the handler wrote the order, and the response is never stored
// (Complete and Release reach nothing).
type diesAfterWrite struct{ storage.Store }

// errDied wraps ErrNotOwner, which the middleware does not retry.
var errDied = fmt.Errorf("the process died: %w", storage.ErrNotOwner)

func (*diesAfterWrite) Complete(context.Context, string, string, []byte, time.Duration) error {
	return errDied
}

func (*diesAfterWrite) Release(context.Context, string, string) error { return errDied }

// reply is an HTTP answer.
type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) replayed() bool { return r.header.Get("Idempotent-Replayed") == "true" }

// same tells whether r has o's status, Location and body.
func (r reply) same(o reply) bool {
	return r.status == o.status && r.header.Get("Location") == o.header.Get("Location") && bytes.Equal(r.body, o.body)
}

// mustPost sends POST /orders with the key and the JSON body.
func mustPost(t *testing.T, base, key, body string) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/orders", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return reply{status: res.StatusCode, header: res.Header, body: b}
}

// transcript splits a demo transcript into its sections, by title.
func transcript(s string) map[string]string {
	m := make(map[string]string)
	for _, sec := range strings.Split(s, "\n# ")[1:] {
		title, rest, _ := strings.Cut(sec, "\n")
		m[title] = strings.TrimSpace(rest)
	}
	return m
}

func lastLine(s string) string { return s[strings.LastIndexByte(s, '\n')+1:] }
