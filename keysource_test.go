package idem_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/nethttp"
)

// sourceReq is a POST with a body of the given type and extra headers.
func sourceReq(body, ctype string, header ...string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/hook", strings.NewReader(body))
	if ctype != "" {
		r.Header.Set("Content-Type", ctype)
	}
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Add(header[i], header[i+1])
	}
	return r
}

const form = "application/x-www-form-urlencoded"

func TestKeySources(t *testing.T) {
	for _, c := range []struct {
		name    string
		src     idem.KeySource
		r       *http.Request
		want    string
		wantErr bool
	}{
		{"header", idem.KeyFromHeader("x-github-delivery"), sourceReq("{}", "", "X-GitHub-Delivery", "72d3162e-cc78-11e3"), "72d3162e-cc78-11e3", false},
		{"header absent", idem.KeyFromHeader("X-GitHub-Delivery"), sourceReq("{}", ""), "", false},
		{"header twice", idem.KeyFromHeader("X-GitHub-Delivery"), sourceReq("{}", "", "X-GitHub-Delivery", "a", "X-GitHub-Delivery", "b"), "", true},
		{"header kept as is", idem.KeyFromHeader("X-Id"), sourceReq("", "", "X-Id", `"quoted"`), `"quoted"`, false},
		{"form", idem.KeyFromForm("notify_id"), sourceReq("notify_id=ac05099524730693a8b330c5ecf72da9786&trade_no=2013", form), "ac05099524730693a8b330c5ecf72da9786", false},
		{"form fields joined", idem.KeyFromForm("trade_no", "trade_status"), sourceReq("trade_status=TRADE_SUCCESS&trade_no=2013112011001004330000121536", form+"; charset=utf-8"), "2013112011001004330000121536:TRADE_SUCCESS", false},
		{"form field escaped", idem.KeyFromForm("id"), sourceReq("id=a%20b%3Ac", form), "a b:c", false},
		{"form fields joined unambiguously", idem.KeyFromForm("a", "b"), sourceReq("a=x%3Ay&b=z", form), "x%3Ay:z", false},
		{"form fields joined unambiguously 2", idem.KeyFromForm("a", "b"), sourceReq("a=x&b=y%3Az", form), "x:y%3Az", false},
		{"form fields percent", idem.KeyFromForm("a", "b"), sourceReq("a=100%25&b=%253A", form), "100%25:%253A", false},
		{"form field absent", idem.KeyFromForm("trade_no", "trade_status"), sourceReq("trade_no=1", form), "", false},
		{"form field empty", idem.KeyFromForm("id"), sourceReq("id=", form), "", false},
		{"form field twice", idem.KeyFromForm("id"), sourceReq("id=1&id=2", form), "", true},
		{"form, not a form", idem.KeyFromForm("id"), sourceReq(`{"id":"1"}`, "application/json"), "", true},
		{"form malformed", idem.KeyFromForm("id"), sourceReq("id=%zz", form), "", true},
		{"json", idem.KeyFromJSON("id"), sourceReq(`{"id":"evt_1NG8Du2eZvKYlo2C","type":"payment_intent.succeeded"}`, "application/json"), "evt_1NG8Du2eZvKYlo2C", false},
		{"json nested", idem.KeyFromJSON("data", "object", "id"), sourceReq(`{"data":{"object":{"id":"pi_3"}}}`, ""), "pi_3", false},
		{"json number", idem.KeyFromJSON("seq"), sourceReq(`{"seq":12345678901234567890}`, ""), "12345678901234567890", false},
		{"json escaped string", idem.KeyFromJSON("id"), sourceReq(`{"id":"a\u0041\"b"}`, ""), `aA"b`, false},
		{"json absent", idem.KeyFromJSON("id"), sourceReq(`{"type":"x"}`, ""), "", false},
		{"json null", idem.KeyFromJSON("id"), sourceReq(`{"id":null}`, ""), "", false},
		{"json path absent", idem.KeyFromJSON("data", "id"), sourceReq(`{"id":"x"}`, ""), "", false},
		{"json not an object", idem.KeyFromJSON("id"), sourceReq(`["id"]`, ""), "", true},
		{"json path through a string", idem.KeyFromJSON("data", "id"), sourceReq(`{"data":"x"}`, ""), "", true},
		{"json object key", idem.KeyFromJSON("id"), sourceReq(`{"id":{"a":1}}`, ""), "", true},
		{"json bool key", idem.KeyFromJSON("id"), sourceReq(`{"id":true}`, ""), "", true},
		{"json malformed", idem.KeyFromJSON("id"), sourceReq(`{"id":`, ""), "", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			body, _ := io.ReadAll(c.r.Body)
			got, err := c.src(c.r, body)
			if got != c.want || (err != nil) != c.wantErr {
				t.Fatalf("got %q, %v; want %q, error %t", got, err, c.want, c.wantErr)
			}
			if err != nil && (strings.Contains(err.Error(), "evt_") || strings.Contains(err.Error(), "pi_")) {
				t.Fatalf("the error quotes the request: %v", err)
			}
		})
	}
}

func TestKeySourcePanics(t *testing.T) {
	for name, f := range map[string]func(){
		"KeyFromForm()": func() { idem.KeyFromForm() },
		"KeyFromJSON()": func() { idem.KeyFromJSON() },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s did not panic", name)
				}
			}()
			f()
		}()
	}
	if _, err := idem.New(nil, idem.WithKey(nil)); !errors.Is(err, idem.ErrInvalidOption) {
		t.Errorf("WithKey(nil): %v, want ErrInvalidOption", err)
	}
}

// hookServer serves a handler behind the middleware with opts, counting
// its runs; the handler answers 201 with the key it was given.
func hookServer(t *testing.T, opts ...idem.Option) (http.Handler, *atomic.Int64) {
	t.Helper()
	mem, _ := newMemStore(t)
	m, err := idem.New(mem, opts...)
	if err != nil {
		t.Fatal(err)
	}
	runs := new(atomic.Int64)
	return nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		info, _ := idem.FromContext(r.Context())
		body, _ := io.ReadAll(r.Body)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "processed "+info.Key+" run "+string(rune('0'+n))+" body "+string(body))
	})), runs
}

func do(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestWithKeyRedelivery: a provider redelivers an event, with a body that
// differs in its delivery time; the handler runs once, and every
// redelivery gets its response, whatever the Idempotency-Key header says.
func TestWithKeyRedelivery(t *testing.T) {
	h, runs := hookServer(t, idem.WithKey(idem.KeyFromJSON("id")))
	first := do(h, sourceReq(`{"id":"evt_1","attempt":1}`, "application/json"))
	if first.Code != http.StatusCreated || first.Body.String() != `processed evt_1 run 1 body {"id":"evt_1","attempt":1}` {
		t.Fatalf("first delivery: %d %q", first.Code, first.Body)
	}
	for i, body := range []string{`{"id":"evt_1","attempt":2}`, `{"id":"evt_1","attempt":1}`} {
		r := sourceReq(body, "application/json", "Idempotency-Key", "other")
		w := do(h, r)
		if w.Code != http.StatusCreated || w.Body.String() != first.Body.String() || w.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("redelivery %d: %d %q replayed %q, want the first response replayed", i, w.Code, w.Body, w.Header().Get("Idempotent-Replayed"))
		}
	}
	if w := do(h, sourceReq(`{"id":"evt_2"}`, "application/json")); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("another event: %d %q", w.Code, w.Body)
	}
	if n := runs.Load(); n != 2 {
		t.Fatalf("%d runs, want 2", n)
	}
}

// TestWithKeyFingerprint: WithFingerprint, before or after WithKey, turns
// the comparison back on.
func TestWithKeyFingerprint(t *testing.T) {
	byBody := idem.WithFingerprint(func(_ *http.Request, body []byte) string { return string(body) })
	for name, opts := range map[string][]idem.Option{
		"after":  {idem.WithKey(idem.KeyFromJSON("id")), byBody},
		"before": {byBody, idem.WithKey(idem.KeyFromJSON("id"))},
	} {
		t.Run(name, func(t *testing.T) {
			h, runs := hookServer(t, opts...)
			do(h, sourceReq(`{"id":"e","n":1}`, "application/json"))
			w := do(h, sourceReq(`{"id":"e","n":2}`, "application/json"))
			if w.Code != http.StatusUnprocessableEntity || !strings.Contains(w.Body.String(), "#ErrMismatch") || runs.Load() != 1 {
				t.Fatalf("another body with the same key: %d %q, %d runs; want 422 ErrMismatch, 1 run", w.Code, w.Body, runs.Load())
			}
		})
	}
}

// TestWithKeyRefusals: without a key, with a malformed one, or with a
// body too large to read, the request gets a 400 (or 413) problem that
// does not quote it, and the handler does not run.
func TestWithKeyRefusals(t *testing.T) {
	long := strings.Repeat("k", idem.MaxKeyLen+1)
	for _, c := range []struct {
		name   string
		src    idem.KeySource
		r      *http.Request
		status int
		kind   error
	}{
		{"no key", idem.KeyFromJSON("id"), sourceReq(`{"type":"secret-type"}`, "application/json"), 400, idem.ErrMissingKey},
		{"not JSON", idem.KeyFromJSON("id"), sourceReq(`secret-body`, "text/plain"), 400, idem.ErrInvalidKey},
		{"too long", idem.KeyFromJSON("id"), sourceReq(`{"id":"`+long+`"}`, "application/json"), 400, idem.ErrInvalidKey},
		{"control character", idem.KeyFromForm("id"), sourceReq("id=secret%0Akey", form), 400, idem.ErrInvalidKey},
		{"header missing", idem.KeyFromHeader("X-GitHub-Delivery"), sourceReq(`{}`, "application/json", "Idempotency-Key", "secret-key"), 400, idem.ErrMissingKey},
		// encoding/json hands the handler the last of members whose names
		// match but for case: a key read from another would let the same
		// event run twice (on the main before this fix the key was the
		// first, secret-x, and the handler processed secret-y).
		{"duplicate member", idem.KeyFromJSON("id"), sourceReq(`{"id":"secret-x","id":"secret-y"}`, "application/json"), 400, idem.ErrInvalidKey},
		{"member in another case", idem.KeyFromJSON("id"), sourceReq(`{"id":"secret-x","ID":"secret-y"}`, "application/json"), 400, idem.ErrInvalidKey},
		{"member in another case first", idem.KeyFromJSON("id"), sourceReq(`{"Id":"secret-y","id":"secret-x"}`, "application/json"), 400, idem.ErrInvalidKey},
		{"member folded by Unicode", idem.KeyFromJSON("kind"), sourceReq(`{"kind":"secret-x","Kind":"secret-y"}`, "application/json"), 400, idem.ErrInvalidKey},
		{"nested duplicate", idem.KeyFromJSON("data", "id"), sourceReq(`{"data":{"id":"secret-x","ID":"secret-y"}}`, "application/json"), 400, idem.ErrInvalidKey},
		{"duplicate parent", idem.KeyFromJSON("data", "id"), sourceReq(`{"data":{"id":"secret-x"},"DATA":{"id":"secret-y"}}`, "application/json"), 400, idem.ErrInvalidKey},
		{"trailing garbage", idem.KeyFromJSON("id"), sourceReq(`{"id":"secret-x"} {"id":"secret-y"}`, "application/json"), 400, idem.ErrInvalidKey},
		{"body too large", idem.KeyFromJSON("id"), sourceReq(`{"id":"secret-id","pad":"`+strings.Repeat("x", 2048)+`"}`, "application/json"), 413, idem.ErrBodyTooLarge},
	} {
		t.Run(c.name, func(t *testing.T) {
			var events []idem.Event
			h, runs := hookServer(t, idem.WithKey(c.src), idem.WithMaxRequestBody(1024),
				idem.WithObserver(func(e idem.Event) { events = append(events, e) }))
			w := do(h, c.r)
			if w.Code != c.status || !strings.Contains(w.Body.String(), "#"+kindName(c.kind)) || runs.Load() != 0 {
				t.Fatalf("%d %q, %d runs; want %d %v, no run", w.Code, w.Body, runs.Load(), c.status, c.kind)
			}
			if strings.Contains(w.Body.String(), "secret") {
				t.Fatalf("the problem quotes the request: %q", w.Body)
			}
			if len(events) != 1 || events[0].Outcome != idem.Rejected || !errors.Is(events[0].Err, c.kind) {
				t.Fatalf("events %+v, want one rejected with %v", events, c.kind)
			}
		})
	}
}

// kindName is the name of kind in its problem type URI.
func kindName(kind error) string {
	typ := (&idem.Error{Kind: kind}).Type()
	return typ[strings.LastIndexByte(typ, '#')+1:]
}

// TestWithKeyUnprotectedMethods: a GET passes through without its body
// being read or a key being looked for.
func TestWithKeyUnprotectedMethods(t *testing.T) {
	h, runs := hookServer(t, idem.WithKey(idem.KeyFromJSON("id")))
	r := httptest.NewRequest(http.MethodGet, "/hook", nil)
	if w := do(h, r); w.Code != http.StatusCreated || runs.Load() != 1 {
		t.Fatalf("GET: %d %q", w.Code, w.Body)
	}
}
