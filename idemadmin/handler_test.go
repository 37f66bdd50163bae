package idemadmin_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemadmin"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage/memstore"
)

// shop is an application with one protected route and the admin handler
// beside it, on one memory store.
type shop struct {
	t     *testing.T
	store *memstore.Store
	m     *idem.Middleware
	app   http.Handler
	runs  atomic.Int32
	hold  chan struct{} // a request with ?hold=1 waits on it
	held  chan struct{} // ... after it has begun
}

func newShop(t *testing.T, opts ...idemadmin.Option) (*shop, *httptest.Server) {
	t.Helper()
	s := &shop{t: t, store: memstore.New(), hold: make(chan struct{}), held: make(chan struct{}, 1)}
	t.Cleanup(func() { s.store.Close() })
	m, err := idem.New(s.store)
	if err != nil {
		t.Fatal(err)
	}
	s.m = m
	mux := http.NewServeMux()
	mux.Handle("POST /orders", nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := s.runs.Add(1)
		if r.URL.Query().Get("hold") != "" {
			s.held <- struct{}{}
			<-s.hold
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/orders/1")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"order":` + string(rune('0'+n)) + `}`))
	})))
	s.app = mux
	admin := httptest.NewServer(http.StripPrefix("/admin", idemadmin.Handler(s.store, opts...)))
	t.Cleanup(admin.Close)
	return s, admin
}

// order sends POST /orders with key as alice.
func (s *shop) order(key, query string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/orders"+query, strings.NewReader(`{"item":"book"}`))
	r.Header.Set("Authorization", "Bearer alice-token")
	r = r.WithContext(idem.ContextWithPrincipal(r.Context(), "alice")) // as the shop's authentication would
	r.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	s.app.ServeHTTP(w, r)
	return w
}

// call sends method to the admin server's path and decodes its JSON body
// into out (when not nil).
func call(t *testing.T, srv *httptest.Server, method, path string, out any) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+"/admin"+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	if out != nil && res.StatusCode < 300 {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %v in %s", method, path, err, b)
		}
	}
	return res.StatusCode, res.Header, string(b)
}

func clientKey(key string) string {
	return "/entry?" + url.Values{"client_key": {key}, "scope": {"alice"}, "method": {"POST"}, "route": {"POST /orders"}}.Encode()
}

// TestEntry: /entry shows a done entry with its response's status, type
// and size, its body and headers only when asked, and an entry in flight
// with its age and lease; by storage key or as the middleware derives it.
func TestEntry(t *testing.T) {
	s, admin := newShop(t)
	if w := s.order("order-1", ""); w.Code != http.StatusCreated {
		t.Fatal(w.Code, w.Body)
	}
	var e idemadmin.Entry
	if code, _, body := call(t, admin, "GET", clientKey("order-1"), &e); code != http.StatusOK {
		t.Fatalf("GET /entry: %d %s", code, body)
	}
	skey := idem.StorageKey("alice", "POST", "POST /orders", "order-1")
	if e.Key != skey || e.State != "done" || e.Since == nil || e.AgeMS == nil || e.Size == 0 || e.Expires.Before(time.Now().Add(23*time.Hour)) {
		t.Errorf("done entry: %+v", e)
	}
	if r := e.Response; r == nil || r.Status != 201 || r.ContentType != "application/json" || r.BodySize != len(`{"order":1}`) || r.Body != nil || r.Header != nil {
		t.Errorf("done entry's response: %+v, want 201 application/json of %d bytes, no body or headers", r, len(`{"order":1}`))
	}
	var full idemadmin.Entry
	call(t, admin, "GET", "/entry?body=true&key="+url.QueryEscape(skey), &full)
	if r := full.Response; r == nil || string(r.Body) != `{"order":1}` || r.Header.Get("Location") != "/orders/1" {
		t.Errorf("with body=true: %+v, want the body and headers", r)
	}

	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- s.order("order-2", "?hold=1") }()
	<-s.held
	var inFlight idemadmin.Entry
	call(t, admin, "GET", clientKey("order-2"), &inFlight)
	if inFlight.State != "in_flight" || inFlight.LeaseLeftMS <= 0 || inFlight.Response != nil || inFlight.Size != 0 {
		t.Errorf("entry in flight: %+v", inFlight)
	}
	close(s.hold)
	<-done

	if code, h, body := call(t, admin, "GET", clientKey("order-3"), nil); code != http.StatusNotFound || h.Get("Content-Type") != "application/problem+json" {
		t.Errorf("a key never sent: %d %s, want a 404 problem", code, body)
	}
	for _, q := range []string{"/entry", "/entry?client_key=k", "/entry?key=a&client_key=b", "/entry?client_key=k&method=POST"} {
		if code, _, body := call(t, admin, "GET", q, nil); code != http.StatusBadRequest || !strings.Contains(body, "key=") {
			t.Errorf("GET %s: %d %s, want a 400 problem naming the parameters", q, code, body)
		}
	}
}

// TestEntryOfDoAndIssuedKeys: op= names Do's entries, issued_key= the
// entries of keys issued under WithIssuedKeys.
func TestEntryOfDoAndIssuedKeys(t *testing.T) {
	s, admin := newShop(t)
	if _, err := s.m.Do(context.Background(), "payments", "pay-1", func(context.Context) ([]byte, error) { return []byte("credited"), nil }); err != nil {
		t.Fatal(err)
	}
	var e idemadmin.Entry
	call(t, admin, "GET", "/entry?op=payments&client_key=pay-1&body=1", &e)
	if e.State != "done" || e.Response == nil || string(e.Response.Body) != "credited" {
		t.Errorf("Do's entry: %+v", e)
	}
	if _, err := s.m.Do(context.Background(), "payments", "pay-2", func(context.Context) ([]byte, error) { return []byte("tenant's"), nil },
		idem.WithCallScope("tenant-7")); err != nil {
		t.Fatal(err)
	}
	var scoped idemadmin.Entry
	call(t, admin, "GET", "/entry?op=payments&client_key=pay-2&scope=tenant-7&body=1", &scoped)
	if scoped.State != "done" || scoped.Response == nil || string(scoped.Response.Body) != "tenant's" {
		t.Errorf("a scoped Do's entry: %+v", scoped)
	}
	if code, _, _ := call(t, admin, "GET", "/entry?op=payments&client_key=pay-2", nil); code != http.StatusNotFound {
		t.Errorf("a scoped Do's entry named without its scope: %d, want 404", code)
	}
	issuing, err := idem.New(s.store, idem.WithIssuedKeys(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodGet, "/form", nil)
	r.Header.Set("Authorization", "Bearer alice-token")
	r = r.WithContext(idem.ContextWithPrincipal(r.Context(), "alice")) // as the shop's authentication would
	key, err := issuing.IssueKey(r)
	if err != nil {
		t.Fatal(err)
	}
	var issued idemadmin.Entry
	call(t, admin, "GET", "/entry?"+url.Values{"issued_key": {key}, "scope": {"alice"}}.Encode(), &issued)
	if issued.State != "issued" || issued.Fingerprint != "" {
		t.Errorf("an issued key: %+v", issued)
	}
}

// TestEntries pages through the entries of a state and by age, and
// refuses bad parameters.
func TestEntries(t *testing.T) {
	s, admin := newShop(t)
	for _, k := range []string{"a", "b", "c"} {
		s.order(k, "")
	}
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- s.order("d", "?hold=1") }()
	<-s.held
	defer func() { close(s.hold); <-done }()

	type page struct {
		Entries []idemadmin.Entry `json:"entries"`
		Next    string            `json:"next"`
	}
	var keys []string
	path := "/entries?state=done&limit=2"
	for range 5 {
		var p page
		if code, _, body := call(t, admin, "GET", path, &p); code != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, code, body)
		}
		for _, e := range p.Entries {
			if e.State != "done" || e.Response != nil {
				t.Errorf("listed %+v, want done entries without responses", e)
			}
			keys = append(keys, e.Key)
		}
		if p.Next == "" {
			break
		}
		path = "/entries?state=done&limit=2&cursor=" + url.QueryEscape(p.Next)
	}
	if len(keys) != 3 {
		t.Errorf("done entries listed: %d, want 3", len(keys))
	}
	var p page
	call(t, admin, "GET", "/entries?state=in_flight", &p)
	if len(p.Entries) != 1 || p.Entries[0].Key != idem.StorageKey("alice", "POST", "POST /orders", "d") {
		t.Errorf("in flight: %+v, want d's entry", p.Entries)
	}
	call(t, admin, "GET", "/entries?min_age=1h", &p)
	if len(p.Entries) != 0 {
		t.Errorf("entries at least an hour old: %+v", p.Entries)
	}
	var st idemadmin.Stats
	call(t, admin, "GET", "/stats", &st)
	if d := idem.StorageKey("alice", "POST", "POST /orders", "d"); st.Entries["done"] != 3 || st.Entries["in_flight"] != 1 || st.OldestInFlight == nil || st.OldestInFlight.Key != d {
		t.Errorf("stats: %+v", st)
	}
	for _, q := range []string{"state=acquired", "min_age=soon", "min_age=-1s", "limit=0", "limit=x", "cursor=%00bad"} {
		if code, h, body := call(t, admin, "GET", "/entries?"+q, nil); code != http.StatusBadRequest || h.Get("Content-Type") != "application/problem+json" {
			t.Errorf("GET /entries?%s: %d %s, want a 400 problem", q, code, body)
		}
	}
}

// TestRemove: without WithRemove, DELETE /entry answers 405 and removes
// nothing; with it, it takes the version GET /entry shows, removes the
// entry, reports it to the hook, and the next request with the key runs
// the handler again.
func TestRemove(t *testing.T) {
	s, admin := newShop(t)
	s.order("order-1", "")
	if code, h, body := call(t, admin, "DELETE", clientKey("order-1")+"&version=x", nil); code != http.StatusMethodNotAllowed || h.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("DELETE without WithRemove: %d %s, want a 405 problem", code, body)
	}
	if w := s.order("order-1", ""); w.Header().Get("Idempotent-Replayed") != "true" || s.runs.Load() != 1 {
		t.Fatalf("after the refused DELETE: replayed %q, %d runs; want the replay", w.Header().Get("Idempotent-Replayed"), s.runs.Load())
	}

	reported := make(chan idemadmin.Entry, 4)
	s2, admin2 := newShop(t, idemadmin.WithRemove(func(r *http.Request, e idemadmin.Entry) { reported <- e }))
	s2.order("order-1", "")
	var shown idemadmin.Entry
	call(t, admin2, "GET", clientKey("order-1"), &shown)
	if shown.Version == "" {
		t.Fatalf("GET /entry shows no version: %+v", shown)
	}
	if code, h, body := call(t, admin2, "DELETE", clientKey("order-1"), nil); code != http.StatusBadRequest || h.Get("Content-Type") != "application/problem+json" || !strings.Contains(body, "version=") {
		t.Errorf("DELETE without version=: %d %s, want a 400 problem naming version=", code, body)
	}
	var e idemadmin.Entry
	if code, _, body := call(t, admin2, "DELETE", clientKey("order-1")+"&version="+url.QueryEscape(shown.Version), &e); code != http.StatusOK || e.State != "done" || e.Version != shown.Version {
		t.Fatalf("DELETE: %d %s, want the done entry", code, body)
	}
	if len(reported) != 1 || (<-reported).Key != e.Key {
		t.Errorf("the removal was not reported once, with its entry")
	}
	if code, _, _ := call(t, admin2, "GET", clientKey("order-1"), nil); code != http.StatusNotFound {
		t.Errorf("GET after DELETE: %d, want 404", code)
	}
	if w := s2.order("order-1", ""); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "" || s2.runs.Load() != 2 {
		t.Errorf("the key after its removal: %d, replayed %q, %d runs; want it run again", w.Code, w.Header().Get("Idempotent-Replayed"), s2.runs.Load())
	}
	if code, _, _ := call(t, admin2, "DELETE", clientKey("order-9")+"&version=x", nil); code != http.StatusNotFound {
		t.Errorf("DELETE of a missing key: %d, want 404", code)
	}
}

// TestRemoveChanged: DELETE /entry removes only the entry that was shown.
// An operator sees an execution in flight; it completes before the DELETE
// arrives: the DELETE removes nothing and answers 409 with the entry as it
// is now, and a retry replays the stored response instead of running the
// handler a second time.
func TestRemoveChanged(t *testing.T) {
	reported := make(chan idemadmin.Entry, 4)
	s, admin := newShop(t, idemadmin.WithRemove(func(r *http.Request, e idemadmin.Entry) { reported <- e }))
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- s.order("order-1", "?hold=1") }()
	<-s.held
	var shown idemadmin.Entry
	call(t, admin, "GET", clientKey("order-1"), &shown)
	if shown.State != "in_flight" || shown.Version == "" {
		t.Fatalf("the entry shown: %+v, want in flight with a version", shown)
	}
	close(s.hold)
	if w := <-done; w.Code != http.StatusCreated {
		t.Fatalf("the held order: %d", w.Code)
	}

	code, h, body := call(t, admin, "DELETE", clientKey("order-1")+"&version="+url.QueryEscape(shown.Version), nil)
	var problem struct {
		Status int             `json:"status"`
		Detail string          `json:"detail"`
		Entry  idemadmin.Entry `json:"entry"`
	}
	if err := json.Unmarshal([]byte(body), &problem); err != nil {
		t.Fatalf("DELETE of a changed entry: %d %s: %v", code, body, err)
	}
	if code != http.StatusConflict || h.Get("Content-Type") != "application/problem+json" || problem.Status != http.StatusConflict ||
		problem.Entry.State != "done" || problem.Entry.Key != shown.Key || problem.Entry.Version == shown.Version || problem.Entry.Version == "" ||
		!strings.Contains(problem.Detail, "changed") {
		t.Errorf("DELETE of an entry that completed since it was shown: %d %s, want a 409 problem with the done entry", code, body)
	}
	if len(reported) != 0 {
		t.Errorf("a removal was reported: %+v", <-reported)
	}
	if w := s.order("order-1", "?hold=1"); w.Header().Get("Idempotent-Replayed") != "true" || s.runs.Load() != 1 {
		t.Errorf("a retry after the refused DELETE: replayed %q, %d runs; want the replay, the handler run once", w.Header().Get("Idempotent-Replayed"), s.runs.Load())
	}
	// The entry as it is now, with its version, can be removed.
	var e idemadmin.Entry
	if code, _, body := call(t, admin, "DELETE", clientKey("order-1")+"&version="+url.QueryEscape(problem.Entry.Version), &e); code != http.StatusOK || e.State != "done" {
		t.Errorf("DELETE with the version of the 409: %d %s", code, body)
	}
}

// TestClientKeys: client_key= and issued_key= are read as the middleware
// reads the key header (idem.ParseKey): the RFC 8941 form a client sends
// names the same entry as the bare key, and a key the middleware refuses
// with 400 is a 400 here too, naming the problem, not "no such entry".
// op= takes the key as Middleware.Do does: as it stands.
func TestClientKeys(t *testing.T) {
	s, admin := newShop(t)
	s.order(`"order-x"`, "")
	s.order(`a"b\c`, "")
	want := idem.StorageKey("alice", "POST", "POST /orders", "order-x")
	for _, k := range []string{"order-x", `"order-x"`} {
		var e idemadmin.Entry
		if code, _, body := call(t, admin, "GET", clientKey(k), &e); code != http.StatusOK || e.Key != want {
			t.Errorf("client_key=%s: %d %s, want order-x's entry %s", k, code, body, want)
		}
	}
	var e idemadmin.Entry
	if code, _, body := call(t, admin, "GET", clientKey(`"a\"b\\c"`), &e); code != http.StatusOK || e.Key != idem.StorageKey("alice", "POST", "POST /orders", `a"b\c`) {
		t.Errorf(`client_key="a\"b\\c": %d %s, want the entry of a"b\c`, code, body)
	}

	bad := map[string]string{
		"256 bytes":         strings.Repeat("k", 256),
		"a control char":    "order\x01",
		"non-ASCII":         "ordér",
		"a malformed quote": `"order`,
		"empty quotes":      `""`,
	}
	for name, k := range bad {
		for _, path := range []string{
			clientKey(k),
			"/entry?" + url.Values{"issued_key": {k}, "scope": {"Bearer alice"}}.Encode(),
		} {
			code, h, body := call(t, admin, "GET", path, nil)
			if code != http.StatusBadRequest || h.Get("Content-Type") != "application/problem+json" || !strings.Contains(body, "idempotency key invalid: the key") {
				t.Errorf("%s: GET %s: %d %s, want a 400 problem naming the key's problem", name, path, code, body)
			}
		}
	}
	if _, err := idemadmin.KeyFromQuery(url.Values{"client_key": {"ordér"}, "method": {"POST"}, "route": {"POST /orders"}}); !errors.Is(err, idem.ErrInvalidKey) {
		t.Errorf("KeyFromQuery of a non-ASCII key: %v, want ErrInvalidKey", err)
	}
	if _, err := idemadmin.KeyFromQuery(url.Values{"key": {"anything at all"}}); err != nil {
		t.Errorf("KeyFromQuery of a storage key: %v, want it as it stands", err)
	}

	// Do takes its key as it stands: "q" with its quotes is a key of its own.
	if _, err := s.m.Do(context.Background(), "payments", `"q"`, func(context.Context) ([]byte, error) { return []byte("quoted"), nil }); err != nil {
		t.Fatal(err)
	}
	var do idemadmin.Entry
	if code, _, body := call(t, admin, "GET", "/entry?"+url.Values{"op": {"payments"}, "client_key": {`"q"`}}.Encode(), &do); code != http.StatusOK || do.Key != idem.OperationStorageKey("", "payments", `"q"`) {
		t.Errorf(`op=payments&client_key="q": %d %s, want Do's entry of "q"`, code, body)
	}
	if code, _, body := call(t, admin, "GET", "/entry?"+url.Values{"op": {"payments"}, "client_key": {strings.Repeat("k", 256)}}.Encode(), nil); code != http.StatusBadRequest || !strings.Contains(body, "longer than 255") {
		t.Errorf("op= with a 256-byte key: %d %s, want 400", code, body)
	}
}

// TestBody: a stored body is text in JSON when it is UTF-8 of a textual
// type (or of none, as Do's results), base64 otherwise, and says which in
// body_encoding; the JSON decodes back to the same bytes.
func TestBody(t *testing.T) {
	for _, c := range []struct {
		contentType string
		body        []byte
		enc, json   string
	}{
		{"application/json", []byte(`{"order":1}`), "text", `"{\"order\":1}"`},
		{"text/plain; charset=utf-8", []byte("héllo\n"), "text", `"héllo\n"`},
		{"application/problem+json", []byte(`{}`), "text", `"{}"`},
		{"", []byte("credited"), "text", `"credited"`},
		{"image/png", []byte("\x89PNG"), "base64", `"iVBORw=="`},
		{"application/octet-stream", []byte("plain"), "base64", `"cGxhaW4="`},
		{"text/plain", []byte("\xff\xfe"), "base64", `"//4="`},
	} {
		r := idemadmin.Response{Status: 200, ContentType: c.contentType, BodySize: len(c.body), Body: c.body}
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]json.RawMessage
		json.Unmarshal(b, &m)
		if r.BodyEncoding() != c.enc || string(m["body_encoding"]) != `"`+c.enc+`"` || string(m["body"]) != c.json {
			t.Errorf("%s %q: %s, want body %s as %s", c.contentType, c.body, b, c.json, c.enc)
		}
		var back idemadmin.Response
		if err := json.Unmarshal(b, &back); err != nil || string(back.Body) != string(c.body) || back.ContentType != c.contentType || back.Status != 200 {
			t.Errorf("%s decoded: %+v, %v", b, back, err)
		}
	}
	b, _ := json.Marshal(idemadmin.Response{Status: 201, BodySize: 3})
	if strings.Contains(string(b), "body\"") || strings.Contains(string(b), "body_encoding") {
		t.Errorf("a response without its body: %s, want neither body nor body_encoding", b)
	}
	var bad idemadmin.Response
	if err := json.Unmarshal([]byte(`{"body":"x","body_encoding":"rot13"}`), &bad); err == nil {
		t.Errorf("an unknown body_encoding decoded: %+v", bad)
	}

	s, admin := newShop(t)
	s.order("order-1", "")
	_, _, body := call(t, admin, "GET", clientKey("order-1")+"&body=1", nil)
	if !strings.Contains(body, `"body":"{\"order\":1}"`) || !strings.Contains(body, `"body_encoding":"text"`) {
		t.Errorf("GET /entry?body=1 of a JSON response: %s, want its body as text", body)
	}
}
