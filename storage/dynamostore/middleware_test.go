package dynamostore_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/dynamotest"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/dynamostore"
)

// service is an order endpoint behind the middleware on a store: POST
// /orders answers 201 with a body of its own each time it runs (body
// bytes when set), so a replay is told from a second run.
type service struct {
	t    *testing.T
	srv  *httptest.Server
	runs atomic.Int64
	body []byte
	m    *idem.Middleware
}

func newService(t *testing.T, store storage.Store, opts ...idem.Option) *service {
	t.Helper()
	m, err := idem.New(store, opts...)
	if err != nil {
		t.Fatal(err)
	}
	sv := &service{t: t, m: m}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		sv.runs.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		if sv.body != nil {
			w.Write(sv.body)
			return
		}
		io.WriteString(w, `{"order":"`+rand.Text()+`"}`)
	})
	sv.srv = httptest.NewServer(nethttp.Middleware(m)(mux))
	t.Cleanup(func() {
		sv.srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		m.Shutdown(ctx)
	})
	return sv
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

func (sv *service) post(key string) answer {
	req, _ := http.NewRequest(http.MethodPost, sv.srv.URL+"/orders", strings.NewReader(`{"item":"book"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", `"`+key+`"`)
	resp, err := sv.srv.Client().Do(req)
	if err != nil {
		sv.t.Error(err)
		return answer{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, b}
}

// TestMiddlewareDuplicates: 64 requests with one key at once, through
// nethttp, on DynamoDB, with WithWait: the handler runs once, and every
// request gets its 201 and the very same body, 63 of them as replays.
func TestMiddlewareDuplicates(t *testing.T) {
	tb := newTable(t)
	sv := newService(t, tb.open(t), idem.WithWait(30*time.Second))
	const n = 64
	answers := make([]answer, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			answers[i] = sv.post("order-64")
		}()
	}
	close(start)
	wg.Wait()
	replays := 0
	for _, a := range answers {
		if a.status != http.StatusCreated || !bytes.Equal(a.body, answers[0].body) {
			t.Fatalf("answer %d %q, want 201 %q", a.status, a.body, answers[0].body)
		}
		if a.header.Get("Idempotent-Replayed") == "true" {
			replays++
		}
	}
	if runs := sv.runs.Load(); runs != 1 || replays != n-1 {
		t.Fatalf("the handler ran %d times, %d replays; want once, %d", runs, replays, n-1)
	}
}

// TestMiddlewareTooLarge: a response that does not fit an item, even
// compressed, reaches its client; the retry gets 409 ErrNotReplayable,
// and the handler never runs again.
func TestMiddlewareTooLarge(t *testing.T) {
	tb := newTable(t)
	sv := newService(t, tb.open(t), idem.WithMaxResponseBody(2<<20))
	sv.body = incompressible(500 << 10)
	first := sv.post("big")
	if first.status != http.StatusCreated || !bytes.Equal(first.body, sv.body) {
		t.Fatalf("first: %d with %d bytes, want 201 with the %d the handler wrote", first.status, len(first.body), len(sv.body))
	}
	retry := sv.post("big")
	if retry.status != http.StatusConflict || !strings.Contains(string(retry.body), "ErrNotReplayable") {
		t.Fatalf("retry: %d %s, want 409 ErrNotReplayable", retry.status, retry.body)
	}
	if runs := sv.runs.Load(); runs != 1 {
		t.Fatalf("the handler ran %d times, want once", runs)
	}
}

// TestMiddlewareKilledServer: while DynamoDB cannot be reached, a request
// gets 503 with Retry-After after the SDK's own retries, and its handler
// does not run; once it is back, the record stored before replays, and
// the request refused then runs.
func TestMiddlewareKilledServer(t *testing.T) {
	p := dynamotest.StartProc(t)
	client := newClient(p.Endpoint(), nil, func(o *dynamodb.Options) {
		o.Retryer = retry.NewStandard(func(so *retry.StandardOptions) { so.MaxAttempts = 2; so.MaxBackoff = 50 * time.Millisecond })
	})
	name := dynamotest.Table(t)
	s, err := dynamostore.New(client, dynamostore.WithTable(name))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateTable(t.Context()); err != nil {
		t.Fatal(err)
	}
	sv := newService(t, s)
	first := sv.post("before")
	if first.status != http.StatusCreated {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	p.Kill()
	down := sv.post("during")
	if down.status != http.StatusServiceUnavailable || down.header.Get("Retry-After") == "" {
		t.Fatalf("with the server killed: %d %v %s, want 503 with Retry-After", down.status, down.header, down.body)
	}
	if runs := sv.runs.Load(); runs != 1 {
		t.Fatalf("the handler ran %d times, want once", runs)
	}
	p.Start()
	if again := sv.post("before"); again.status != http.StatusCreated || !bytes.Equal(again.body, first.body) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay after the restart: %d %q, want the first's 201 %q", again.status, again.body, first.body)
	}
	if later := sv.post("during"); later.status != http.StatusCreated || sv.runs.Load() != 2 {
		t.Fatalf("the refused request again: %d, %d runs; want 201 and 2", later.status, sv.runs.Load())
	}
}

// refusing answers every DynamoDB request with an error of DynamoDB's
// while on, as DynamoDB does when it throttles or fails.
type refusing struct {
	on     atomic.Bool
	typ    string
	status int
	puts   atomic.Int64 // PutItems refused
	rt     http.RoundTripper
}

func (f *refusing) RoundTrip(r *http.Request) (*http.Response, error) {
	if !f.on.Load() {
		return f.rt.RoundTrip(r)
	}
	if r.Header.Get("X-Amz-Target") == "DynamoDB_20120810.PutItem" {
		f.puts.Add(1)
	}
	body := `{"__type":"com.amazonaws.dynamodb.v20120810#` + f.typ + `","message":"refused by the test"}`
	return &http.Response{StatusCode: f.status, Status: http.StatusText(f.status), Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:  http.Header{"Content-Type": {"application/x-amz-json-1.0"}, "X-Amzn-Requestid": {"test"}},
		Body:    io.NopCloser(strings.NewReader(body)),
		Request: r}, nil
}

// TestMiddlewareThrottled: throttling and DynamoDB's internal errors are
// the store being unavailable: the SDK retries them (3 attempts here),
// and then the request gets 503 with Retry-After; the handler does not
// run, and the store's answers never show a failed condition as a 5xx.
func TestMiddlewareThrottled(t *testing.T) {
	tb := newTable(t)
	for _, c := range []struct {
		typ    string
		status int
	}{
		{"ProvisionedThroughputExceededException", 400},
		{"ThrottlingException", 400},
		{"InternalServerError", 500},
	} {
		t.Run(c.typ, func(t *testing.T) {
			f := &refusing{typ: c.typ, status: c.status, rt: http.DefaultTransport}
			client := dynamodb.New(dynamodb.Options{
				Region: "us-east-1", BaseEndpoint: aws.String(dynamotest.Endpoint(t)),
				Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
					return aws.Credentials{AccessKeyID: "idem", SecretAccessKey: "idem"}, nil
				}),
				HTTPClient: &http.Client{Transport: f},
				Retryer: retry.NewStandard(func(so *retry.StandardOptions) {
					so.MaxAttempts = 3
					so.MaxBackoff = 20 * time.Millisecond
					so.RateLimiter = noLimit{}
				}),
			})
			s, err := dynamostore.New(client, dynamostore.WithTable(tb.name))
			if err != nil {
				t.Fatal(err)
			}
			sv := newService(t, s)
			f.on.Store(true)
			a := sv.post("throttled-" + c.typ)
			if a.status != http.StatusServiceUnavailable || a.header.Get("Retry-After") == "" || sv.runs.Load() != 0 {
				t.Fatalf("%d %v %s, %d runs; want 503 with Retry-After and no run", a.status, a.header, a.body, sv.runs.Load())
			}
			if n := f.puts.Load(); n != 3 {
				t.Errorf("Acquire sent %d PutItems, want 3 (the SDK's retries)", n)
			}
			f.on.Store(false)
			if a := sv.post("throttled-" + c.typ); a.status != http.StatusCreated || sv.runs.Load() != 1 {
				t.Fatalf("once DynamoDB answers: %d, %d runs; want 201 and 1", a.status, sv.runs.Load())
			}
		})
	}
}

// noLimit lets every retry through: the SDK's retry quota would refuse
// retries once a test has spent it.
type noLimit struct{}

func (noLimit) GetToken(context.Context, uint) (func() error, error) {
	return func() error { return nil }, nil
}
func (noLimit) AddTokens(uint) error { return nil }
