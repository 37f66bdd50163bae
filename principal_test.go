package idem_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
)

// authenticate is an application's authentication middleware: it verifies
// the bearer token (here, a table of the tokens it minted) and names the
// token's subject as the principal. Tokens it does not know get 401.
func authenticate(subjects map[string]string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sub, ok := subjects[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
		if !ok {
			http.Error(w, "unauthenticated", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(idem.ContextWithPrincipal(r.Context(), sub)))
	})
}

// authPost sends a POST /orders with key, body and an Authorization header
// (none when auth is "") through h.
func authPost(h http.Handler, auth, key, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(body))
	r.Header.Set("Idempotency-Key", key)
	if auth != "" {
		r.Header.Set("Authorization", auth)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// A client whose access token is refreshed between two attempts of one
// operation stays in its scope under the default: the principal that the
// authentication middleware named, not the token. The retry with the new
// token is a replay, and the handler runs once. Another principal using
// the same key and body runs its own request and never sees the first's
// response.
func TestPrincipalScopeSurvivesRefreshedToken(t *testing.T) {
	mem, _ := newMemStore(t)
	m, err := idem.New(mem)
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	h := authenticate(map[string]string{"t1": "alice", "t2": "alice", "t3": "bob"},
		nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			p, _ := idem.PrincipalFromContext(r.Context())
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, "order %d for %s", runs.Add(1), p)
		})))

	if w := authPost(h, "Bearer t1", "k", `{"amount":5}`); w.Code != http.StatusCreated || w.Body.String() != "order 1 for alice" {
		t.Fatalf("alice's first attempt: %d %q", w.Code, w.Body)
	}
	w := authPost(h, "Bearer t2", "k", `{"amount":5}`) // the token was refreshed
	if w.Code != http.StatusCreated || w.Body.String() != "order 1 for alice" || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("alice's retry with a refreshed token: %d %q replayed=%q, want the replay of order 1", w.Code, w.Body, w.Header().Get("Idempotent-Replayed"))
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times for alice's one operation, want 1", n)
	}
	if w := authPost(h, "Bearer t3", "k", `{"amount":5}`); w.Code != http.StatusCreated || w.Body.String() != "order 2 for bob" || w.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("bob with alice's key and body: %d %q, want his own execution", w.Code, w.Body)
	}
	if w := authPost(h, "Bearer t3", "k", `{"amount":5}`); w.Body.String() != "order 2 for bob" || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("bob's retry: %d %q, want the replay of his own order", w.Code, w.Body)
	}
	if w := authPost(h, "Bearer t2", "k", `{"amount":5}`); w.Body.String() != "order 1 for alice" {
		t.Fatalf("alice again after bob: %d %q", w.Code, w.Body)
	}
}

// scopeUnknownDetail is what a request refused with ErrScopeUnknown is told.
const scopeUnknownDetail = "idem cannot tell which principal this request acts for: name it with idem.ContextWithPrincipal in your authentication middleware, or choose a scope with idem.WithScope (idem.AuthorizationScope keeps the old behaviour: the header whole)."

// A request that carries credentials and no principal, under the default
// scope, is refused before anything runs: the store is not asked, the
// handler does not run, the client gets a 500 problem that says what to
// do, and the observer is told.
func TestScopeUnknownRefused(t *testing.T) {
	mem, _ := newMemStore(t)
	var acquires atomic.Int64
	store := &hookStore{Store: mem, acquire: func(ctx context.Context, key, owner, fp string, lease time.Duration) (storage.Result, error) {
		acquires.Add(1)
		return mem.Acquire(ctx, key, owner, fp, lease)
	}}
	var events []idem.Event
	m, err := idem.New(store, idem.WithObserver(func(ev idem.Event) { events = append(events, ev) }))
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	w := authPost(h, "Bearer t1", "k", "{}")
	if w.Code != http.StatusInternalServerError || w.Header().Get("Content-Type") != "application/problem+json" || w.Header().Get("Retry-After") != "" {
		t.Fatalf("credentials without a principal: %d %q Retry-After %q %s", w.Code, w.Header().Get("Content-Type"), w.Header().Get("Retry-After"), w.Body)
	}
	var p struct{ Type, Title, Detail string }
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatal(err)
	}
	if p.Type != "https://pkg.go.dev/github.com/idemkit/idem#ErrScopeUnknown" || p.Detail != scopeUnknownDetail {
		t.Fatalf("problem: %+v", p)
	}
	if runs.Load() != 0 || acquires.Load() != 0 {
		t.Fatalf("handler runs %d, store acquires %d: want none", runs.Load(), acquires.Load())
	}
	if len(events) != 1 || events[0].Outcome != idem.Rejected || events[0].Status != 500 || !errors.Is(events[0].Err, idem.ErrScopeUnknown) {
		t.Fatalf("events: %+v", events)
	}

	// No credentials: the anonymous scope, as before.
	if w := authPost(h, "", "k", "{}"); w.Code != http.StatusCreated || runs.Load() != 1 {
		t.Fatalf("anonymous: %d, runs %d", w.Code, runs.Load())
	}
	// A request without a key is not protected, and not refused.
	r := httptest.NewRequest(http.MethodPost, "/orders", nil)
	r.Header.Set("Authorization", "Bearer t1")
	w = httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusCreated || runs.Load() != 2 {
		t.Fatalf("no key: %d, runs %d", w.Code, runs.Load())
	}
	// An empty principal names none: still refused.
	r = httptest.NewRequest(http.MethodPost, "/orders", nil)
	r.Header.Set("Authorization", "Bearer t1")
	r.Header.Set("Idempotency-Key", "k")
	r = r.WithContext(idem.ContextWithPrincipal(r.Context(), ""))
	w = httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusInternalServerError || runs.Load() != 2 {
		t.Fatalf("empty principal: %d, runs %d", w.Code, runs.Load())
	}
}

// WithScope(idem.AuthorizationScope) is the explicit opt-in to the header,
// whole: for credentials that never change. A changed header is another
// scope; no refusal.
func TestAuthorizationScopeExplicit(t *testing.T) {
	mem, _ := newMemStore(t)
	m, err := idem.New(mem, idem.WithScope(idem.AuthorizationScope))
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	for _, auth := range []string{"Basic a2V5MQ==", "Basic a2V5MQ==", "Basic a2V5Mg=="} {
		if w := authPost(h, auth, "k", "{}"); w.Code != http.StatusCreated {
			t.Fatalf("%s: %d %s", auth, w.Code, w.Body)
		}
	}
	if runs.Load() != 2 {
		t.Fatalf("runs %d, want 2 (one per header value)", runs.Load())
	}
}

// Issued keys use the same scope: IssueKey refuses credentials without a
// principal, and a key issued to alice is hers whatever token she sends.
func TestIssuedKeysPrincipalScope(t *testing.T) {
	mem, _ := newMemStore(t)
	m, err := idem.New(mem, idem.WithIssuedKeys(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	form := httptest.NewRequest(http.MethodGet, "/form", nil)
	form.Header.Set("Authorization", "Bearer t1")
	if key, err := m.IssueKey(form); key != "" || !errors.Is(err, idem.ErrScopeUnknown) {
		t.Fatalf("IssueKey to credentials without a principal: %q %v", key, err)
	}
	var ie *idem.Error
	if _, err := m.IssueKey(form); !errors.As(err, &ie) || ie.Status != 500 || ie.Detail != scopeUnknownDetail {
		t.Fatalf("IssueKey's refusal: %#v", err)
	}
	key, err := m.IssueKey(form.WithContext(idem.ContextWithPrincipal(form.Context(), "alice")))
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	h := authenticate(map[string]string{"t1": "alice", "t2": "alice", "t3": "bob"},
		nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			w.WriteHeader(http.StatusCreated)
		})))
	if w := authPost(h, "Bearer t3", key, "{}"); w.Code != http.StatusBadRequest {
		t.Fatalf("bob using alice's key: %d %s", w.Code, w.Body)
	}
	if w := authPost(h, "Bearer t2", key, "{}"); w.Code != http.StatusCreated {
		t.Fatalf("alice using her key with a refreshed token: %d %s", w.Code, w.Body)
	}
	if w := authPost(h, "Bearer t1", key, "{}"); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" || runs.Load() != 1 {
		t.Fatalf("alice's retry: %d, runs %d", w.Code, runs.Load())
	}
	// Through the middleware, too: an issued-keys route refuses.
	if w := authPost(nethttp.Middleware(m)(http.NotFoundHandler()), "Bearer t1", key, "{}"); w.Code != http.StatusInternalServerError {
		t.Fatalf("an issued-keys route, credentials without a principal: %d %s", w.Code, w.Body)
	}
}

// Do's default scope is the principal in its ctx: a principal's calls
// share their records, two principals' never meet. WithCallScope chooses
// another, and WithCallScope("") none.
func TestDoPrincipalScope(t *testing.T) {
	mem, _ := newMemStore(t)
	m, err := idem.New(mem)
	if err != nil {
		t.Fatal(err)
	}
	alice := idem.ContextWithPrincipal(context.Background(), "alice")
	bob := idem.ContextWithPrincipal(context.Background(), "bob")
	var runs atomic.Int64
	var skeys []string
	fn := func(ctx context.Context) ([]byte, error) {
		runs.Add(1)
		info, _ := idem.FromContext(ctx)
		skeys = append(skeys, info.StorageKey)
		p, _ := idem.PrincipalFromContext(ctx)
		return []byte("for " + p), nil
	}
	for _, c := range []struct {
		ctx  context.Context
		opts []idem.CallOption
		want string
		runs int64
	}{
		{alice, nil, "for alice", 1},
		{alice, nil, "for alice", 1},
		{bob, nil, "for bob", 2},
		{alice, []idem.CallOption{idem.WithCallScope("alice")}, "for alice", 2}, // the same record
		{context.Background(), nil, "for ", 3},
		{alice, []idem.CallOption{idem.WithCallScope("")}, "for ", 3}, // unscoped: the anonymous record
	} {
		out, err := m.Do(c.ctx, "op", "k", fn, c.opts...)
		if err != nil || string(out) != c.want || runs.Load() != c.runs {
			t.Fatalf("Do: %q %v runs %d, want %q runs %d", out, err, runs.Load(), c.want, c.runs)
		}
	}
	want := []string{idem.OperationStorageKey("alice", "op", "k"), idem.OperationStorageKey("bob", "op", "k"), idem.OperationStorageKey("", "op", "k")}
	if fmt.Sprint(skeys) != fmt.Sprint(want) {
		t.Fatalf("storage keys %q, want %q", skeys, want)
	}
}
