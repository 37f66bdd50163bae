package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/dynamotest"
	"github.com/idemkit/idem/internal/mysqltest"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/redistest"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/dynamostore"
	"github.com/idemkit/idem/storage/pgstore"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/idemkit/idem/storage/sqlstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// idemctl runs idemctl in-process with args and stdin, and returns its
// exit status, standard output and standard error.
func idemctl(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return idemctlIn(t, strings.NewReader(stdin), args...)
}

// idemctlIn is idemctl with stdin as standard input.
func idemctlIn(t *testing.T, stdin io.Reader, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut strings.Builder
	code = run(context.Background(), args, stdin, &out, &errOut)
	return code, out.String(), errOut.String()
}

// answerAfter is a standard input that calls before when it is first
// read (once idemctl has asked its question), and then answers answer.
type answerAfter struct {
	before func()
	answer string
	asked  bool
}

func (r *answerAfter) Read(p []byte) (int, error) {
	if r.asked {
		return 0, io.EOF
	}
	r.asked = true
	r.before()
	return copy(p, r.answer), nil
}

// mustRun runs idemctl, and fails the test unless it exits with want.
func mustRun(t *testing.T, want int, stdin string, args ...string) (stdout, stderr string) {
	t.Helper()
	code, stdout, stderr := idemctl(t, stdin, args...)
	if code != want {
		t.Fatalf("idemctl %q: exit status %d, want %d\nstdout:\n%s\nstderr:\n%s", args, code, want, stdout, stderr)
	}
	return stdout, stderr
}

// mustRunOut runs idemctl with args and no input, fails the test unless
// it exits 0, and returns its standard output.
func mustRunOut(t *testing.T, args []string) string {
	t.Helper()
	out, _ := mustRun(t, 0, "", args...)
	return out
}

// decode decodes idemctl's JSON output into v.
func decode(t *testing.T, out string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("%v in:\n%s", err, out)
	}
}

// field returns the value of the line "name  value" of inspect's output.
func field(out, name string) string {
	for line := range strings.Lines(out) {
		if v, ok := strings.CutPrefix(line, name+"  "); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// rows returns the rows of ls's table, each split into its columns, and
// its last line when it is not a row (it says there were more).
func rows(t *testing.T, out string) (table [][]string, last string) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if out == "no entries\n" {
		return nil, ""
	}
	if len(lines) == 0 || strings.Join(strings.Fields(lines[0]), " ") != "KEY STATE AGE LEASE-LEFT EXPIRES-IN SIZE" {
		t.Fatalf("ls printed no table:\n%s", out)
	}
	for _, l := range lines[1:] {
		if strings.HasPrefix(l, "more ") {
			return table, l
		}
		table = append(table, strings.Fields(l))
	}
	return table, ""
}

// backend is a store that idemctl serves.
type backend struct {
	name string
	// open returns a store of the test's own (a Redis prefix, a
	// PostgreSQL table, a MySQL database) and idemctl's global flags for
	// it.
	open func(t *testing.T) (storage.Inspector, []string)
}

var backends = []backend{
	{"redis", openRedis},
	{"postgres", func(t *testing.T) (storage.Inspector, []string) {
		_, store, flags := openPG(t)
		return store, flags
	}},
	{"mysql", func(t *testing.T) (storage.Inspector, []string) {
		_, store, flags := openMySQL(t)
		return store, flags
	}},
	{"dynamodb", func(t *testing.T) (storage.Inspector, []string) {
		store, flags := openDynamoDB(t)
		return store, flags
	}},
}

// each runs f on every backend.
func each(t *testing.T, f func(t *testing.T, store storage.Inspector, flags []string)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			store, flags := b.open(t)
			f(t, store, flags)
		})
	}
}

// openRedis returns a store on the shared redis-server under a prefix of
// the test's own.
func openRedis(t *testing.T) (storage.Inspector, []string) {
	addr := redistest.Addr(t)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { rdb.Close() })
	prefix := "idemctl-test:" + rand.Text()[:10] + ":"
	return redisstore.New(rdb, redisstore.WithPrefix(prefix)), []string{"-redis", addr, "-prefix", prefix}
}

// openPG returns a pool on the shared PostgreSQL, and a store on a table
// of the test's own, dropped when the test ends.
func openPG(t *testing.T) (*pgxpool.Pool, *pgstore.Store, []string) {
	dsn := pgtest.DSN(t)
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	b := make([]byte, 8)
	rand.Read(b)
	table := "idemctl_test_" + hex.EncodeToString(b)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP TABLE IF EXISTS "+pgx.Identifier{table}.Sanitize()); err != nil {
			t.Errorf("dropping table %s: %v", table, err)
		}
	})
	store, err := pgstore.New(pool, pgstore.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	if err := store.CreateTable(context.Background()); err != nil {
		t.Fatal(err)
	}
	return pool, store, []string{"-pg", dsn, "-table", table}
}

// openMySQL returns a pool on a database of the test's own on the shared
// MariaDB (dropped when the test ends), and a store on a table of the
// test's own there.
func openMySQL(t *testing.T) (*sql.DB, *sqlstore.Store, []string) {
	dsn := mysqltest.DSN(t)
	admin, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	name := mysqltest.Database(t, func(q string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := admin.ExecContext(ctx, q)
		return err
	})
	dsn = mysqltest.WithDatabase(dsn, name)
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	b := make([]byte, 8)
	rand.Read(b)
	table := "idemctl_test_" + hex.EncodeToString(b)
	store, err := sqlstore.New(db, sqlstore.MySQL, sqlstore.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	if err := store.CreateTable(context.Background()); err != nil {
		t.Fatal(err)
	}
	return db, store, []string{"-mysql", dsn, "-table", table}
}

// The client of the shop's orders, and the route.
const (
	scope = "alice"
	route = "POST /orders"
)

// skey is the storage key of the client's order key.
func skey(key string) string { return idem.StorageKey(scope, "POST", route, key) }

// shop is a service on a store: POST /orders through an idem middleware
// on net/http, answering 201 with the order's number, and counting its
// handler's runs. A request with ?hold=1 stays in flight until released.
type shop struct {
	t     *testing.T
	store storage.Store
	m     *idem.Middleware
	app   http.Handler
	runs  atomic.Int32
	held  chan struct{} // a held request sends on it once it runs
	hold  chan struct{} // ... and waits until it is closed
}

func newShop(t *testing.T, store storage.Store) *shop {
	t.Helper()
	s := &shop{t: t, store: store, held: make(chan struct{}, 1), hold: make(chan struct{})}
	m, err := idem.New(store)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := m.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	})
	s.m = m
	mux := http.NewServeMux()
	mux.Handle(route, nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := s.runs.Add(1)
		if r.URL.Query().Get("hold") != "" {
			s.held <- struct{}{}
			<-s.hold
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/orders/"+strconv.Itoa(int(n)))
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"order":` + strconv.Itoa(int(n)) + `}`))
	})))
	s.app = mux
	return s
}

// send sends POST /orders with the key as the client.
func (s *shop) send(key, query string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/orders"+query, strings.NewReader(`{"item":"book"}`))
	r.Header.Set("Authorization", "Bearer alice-token")
	r = r.WithContext(idem.ContextWithPrincipal(r.Context(), scope)) // as the shop's authentication would
	r.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	s.app.ServeHTTP(w, r)
	return w
}

// order places an order with the key, and fails the test unless it gets
// 201.
func (s *shop) order(key string) *httptest.ResponseRecorder {
	s.t.Helper()
	w := s.send(key, "")
	if w.Code != http.StatusCreated {
		s.t.Fatalf("order %s: %d %s", key, w.Code, w.Body)
	}
	return w
}

// orderHeld sends an order with the key that stays in flight, its handler
// running, until release is called (at the latest when the test ends).
// One per shop.
func (s *shop) orderHeld(key string) (release func()) {
	s.t.Helper()
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- s.send(key, "?hold=1") }()
	select {
	case <-s.held:
	case w := <-done:
		s.t.Fatalf("the held order %s did not run its handler: %d %s", key, w.Code, w.Body)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			close(s.hold)
			<-done
		})
	}
	s.t.Cleanup(release)
	return release
}

// do runs Middleware.Do for the operation and key, whose function answers
// result.
func (s *shop) do(op, key, result string) {
	s.t.Helper()
	if _, err := s.m.Do(context.Background(), op, key, func(context.Context) ([]byte, error) { return []byte(result), nil }); err != nil {
		s.t.Fatal(err)
	}
}

// issue issues a key to the client, through a middleware WithIssuedKeys
// on the shop's store, and returns it.
func (s *shop) issue() string {
	s.t.Helper()
	m, err := idem.New(s.store, idem.WithIssuedKeys(time.Hour))
	if err != nil {
		s.t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodGet, "/form", nil)
	r.Header.Set("Authorization", "Bearer alice-token")
	r = r.WithContext(idem.ContextWithPrincipal(r.Context(), scope)) // as the shop's authentication would
	key, err := m.IssueKey(r)
	if err != nil {
		s.t.Fatal(err)
	}
	return key
}

// closedAddr returns a loopback address where nothing listens.
func closedAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// dynamoClient returns a client of the DynamoDB API at endpoint (dynalite:
// any region, any keys), whose idle connections close when the test ends.
func dynamoClient(t *testing.T, endpoint string) *dynamodb.Client {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(endpoint),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test"}, nil
		}),
		HTTPClient: &http.Client{Transport: tr},
	})
}

// openDynamoDB returns a store on a table of the test's own on the shared
// dynalite, deleted when the test ends, and idemctl's global flags for it:
// -dynamodb TABLE -endpoint URL, with no region and no credentials (the
// test's environment names none: idemctl's defaults for an endpoint).
func openDynamoDB(t *testing.T) (*dynamostore.Store, []string) {
	endpoint := dynamotest.Endpoint(t)
	noAWSEnvironment(t)
	client := dynamoClient(t, endpoint)
	table := dynamotest.Table(t)
	store, err := dynamostore.New(client, dynamostore.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	if err := store.CreateTable(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := client.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(table)}); err != nil {
			t.Errorf("deleting table %s: %v", table, err)
		}
	})
	return store, []string{"-dynamodb", table, "-endpoint", endpoint}
}

// noAWSEnvironment clears, for the test, the environment variables that
// would give idemctl's AWS SDK a region, credentials, a profile or
// configuration files of the machine's.
func noAWSEnvironment(t *testing.T) {
	for _, v := range append([]string{"AWS_REGION", "AWS_DEFAULT_REGION", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
		"AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_DYNAMODB", envDynamoDB}, credentialVars...) {
		t.Setenv(v, "")
	}
	dir := t.TempDir()
	t.Setenv("AWS_CONFIG_FILE", dir+"/config")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", dir+"/credentials")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
}
