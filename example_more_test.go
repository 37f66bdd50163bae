package idem_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/memstore"
)

// serveCounting serves a handler behind m that answers status with the
// number of its run, and returns the server's URL and a function that
// closes it.
func serveCounting(m *idem.Middleware, status int) (string, func()) {
	runs := 0
	srv := httptest.NewServer(nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		w.WriteHeader(status)
		fmt.Fprintf(w, "run %d", runs)
	})))
	return srv.URL, srv.Close
}

// WithScope keeps the records of different principals apart: the same key
// sent by two tenants runs twice, once for each. The default scope is the
// principal that the application's authentication names with
// idem.ContextWithPrincipal (see ExampleContextWithPrincipal).
func ExampleWithScope() {
	store := memstore.New()
	defer store.Close()
	m, err := idem.New(store, idem.WithScope(func(r *http.Request) string { return r.Header.Get("X-Tenant") }))
	if err != nil {
		log.Fatal(err)
	}
	url, done := serveCounting(m, http.StatusCreated)
	defer done()
	for _, tenant := range []string{"acme", "acme", "globex"} {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", "order-1")
		req.Header.Set("X-Tenant", tenant)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		res.Body.Close()
		fmt.Println(tenant, res.StatusCode, "replayed:", res.Header.Get("Idempotent-Replayed") == "true")
	}
	// Output:
	// acme 201 replayed: false
	// acme 201 replayed: true
	// globex 201 replayed: false
}

// WithRequireKey refuses a protected request without a key with 400,
// instead of letting it through unprotected; WithMethods chooses the
// protected methods and WithHeader the header.
func ExampleWithRequireKey() {
	store := memstore.New()
	defer store.Close()
	m, err := idem.New(store, idem.WithRequireKey(), idem.WithMethods(http.MethodPost, http.MethodPut),
		idem.WithHeader("X-Request-Id"))
	if err != nil {
		log.Fatal(err)
	}
	url, done := serveCounting(m, http.StatusOK)
	defer done()
	for _, c := range []struct{ method, key string }{{"PUT", ""}, {"PUT", "r-1"}, {"PUT", "r-1"}, {"GET", ""}} {
		req, _ := http.NewRequest(c.method, url, nil)
		if c.key != "" {
			req.Header.Set("X-Request-Id", c.key)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		res.Body.Close()
		fmt.Printf("%s key=%q: %d replayed=%q\n", c.method, c.key, res.StatusCode, res.Header.Get("Idempotent-Replayed"))
	}
	// Output:
	// PUT key="": 400 replayed=""
	// PUT key="r-1": 200 replayed=""
	// PUT key="r-1": 200 replayed="true"
	// GET key="": 200 replayed=""
}

// WithCacheable decides which statuses are final: the others release the
// key, so a retry runs again. Here a 409 from the application (a business
// conflict that may clear) is not kept either.
func ExampleWithCacheable() {
	store := memstore.New()
	defer store.Close()
	m, err := idem.New(store, idem.WithCacheable(func(status int) bool {
		return status != http.StatusConflict && idem.DefaultCacheable(status)
	}))
	if err != nil {
		log.Fatal(err)
	}
	url, done := serveCounting(m, http.StatusConflict)
	defer done()
	post(url, "k-1", "{}")
	post(url, "k-1", "{}") // released: runs again
	// Output:
	// 409 replayed="" run 1
	// 409 replayed="" run 2
}

// downStore is a store that cannot be reached.
type downStore struct{ storage.Store }

func (downStore) Acquire(context.Context, string, string, string, time.Duration) (storage.Result, error) {
	return storage.Result{}, errors.New("dial tcp: connection refused")
}

// With WithFailOpen, a request whose store cannot be reached runs
// unprotected (Info.Protected is false) instead of getting 503.
func ExampleWithFailOpen() {
	store := memstore.New()
	defer store.Close()
	for _, opts := range [][]idem.Option{nil, {idem.WithFailOpen()}} {
		m, err := idem.New(downStore{store}, opts...)
		if err != nil {
			log.Fatal(err)
		}
		srv := httptest.NewServer(nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			info, _ := idem.FromContext(r.Context())
			fmt.Fprintf(w, "ran, protected: %v", info.Protected)
		})))
		post(srv.URL, "k-1", "{}")
		srv.Close()
	}
	// Output:
	// 503 replayed="" application/problem+json
	// 200 replayed="" ran, protected: false
}

// KeyFromForm takes the key from a form field (a browser cannot set a
// header on a form's submission); KeyFromHeader from another header, as a
// provider's delivery id.
func ExampleKeyFromForm() {
	store := memstore.New()
	defer store.Close()
	m, err := idem.New(store, idem.WithKey(idem.KeyFromForm("idempotency_key")))
	if err != nil {
		log.Fatal(err)
	}
	u, done := serveCounting(m, http.StatusCreated)
	defer done()
	for range 2 {
		res, err := http.PostForm(u, url.Values{"idempotency_key": {"form-7"}, "item": {"book"}})
		if err != nil {
			log.Fatal(err)
		}
		res.Body.Close()
		fmt.Println(res.StatusCode, "replayed:", res.Header.Get("Idempotent-Replayed") == "true")
	}
	// Output:
	// 201 replayed: false
	// 201 replayed: true
}

// WithMaxRequestBody bounds the body idem buffers to compare requests: a
// larger one gets 413 and the handler does not run.
func ExampleWithMaxRequestBody() {
	store := memstore.New()
	defer store.Close()
	m, err := idem.New(store, idem.WithMaxRequestBody(16))
	if err != nil {
		log.Fatal(err)
	}
	url, done := serveCounting(m, http.StatusCreated)
	defer done()
	post(url, "k-1", `{"item":"book"}`)
	post(url, "k-2", `{"item":"a very long list of things"}`)
	// Output:
	// 201 replayed="" run 1
	// 413 replayed="" application/problem+json
}

// WithoutFingerprint stops comparing retries with the first request: the
// key alone decides, so a retry with another body is replayed, not 422.
// WithFingerprint chooses what is compared instead.
func ExampleWithoutFingerprint() {
	store := memstore.New()
	defer store.Close()
	m, err := idem.New(store, idem.WithoutFingerprint())
	if err != nil {
		log.Fatal(err)
	}
	url, done := serveCounting(m, http.StatusCreated)
	defer done()
	post(url, "k-1", `{"amount":12}`)
	post(url, "k-1", `{"amount":99}`)
	// Output:
	// 201 replayed="" run 1
	// 201 replayed="true" run 1
}

// WithTTL is how long a response is replayed, WithLease how long a key
// stays locked after its process died (renewed while the handler runs).
func ExampleWithTTL() {
	store := memstore.New()
	defer store.Close()
	m, err := idem.New(store, idem.WithTTL(72*time.Hour), idem.WithLease(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	_ = m
	_, err = idem.New(store, idem.WithTTL(0))
	fmt.Println(errors.Is(err, idem.ErrInvalidOption))
	// Output: true
}

// An operator looks up what the store holds for a customer's key: the
// storage key is derived as the middleware derives it, from the scope
// (here the default, the principal that the authentication named), the
// method, the route and the key the client sent.
func ExampleStorageKey() {
	store := memstore.New()
	defer store.Close()
	m, _ := idem.New(store)
	mux := http.NewServeMux()
	mux.Handle("POST /orders", nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"order":42}`)
	})))
	r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"item":"book"}`))
	r.Header.Set("Authorization", "Bearer alice-token")
	r.Header.Set("Idempotency-Key", "order-42")
	r = r.WithContext(idem.ContextWithPrincipal(r.Context(), "alice")) // as the authentication does
	mux.ServeHTTP(httptest.NewRecorder(), r)

	key := idem.StorageKey("alice", http.MethodPost, "POST /orders", "order-42")
	e, err := store.Lookup(context.Background(), key, false)
	fmt.Println(e.State, err)
	_, err = store.Lookup(context.Background(), idem.StorageKey("bob", http.MethodPost, "POST /orders", "order-42"), false)
	fmt.Println(errors.Is(err, storage.ErrNotFound))
	// Output:
	// done <nil>
	// true
}

// A job submitted by several tenants, each with keys of its own, that must
// not run again with other arguments under a key it already used: Do
// keeps each tenant's record apart (WithCallScope) and refuses a key
// reused for other work (WithCallFingerprint).
func ExampleWithCallFingerprint() {
	store := memstore.New()
	defer store.Close()
	m, _ := idem.New(store)
	charge := func(tenant, key, args string) (string, error) {
		res, err := m.Do(context.Background(), "charges", key, func(context.Context) ([]byte, error) {
			return []byte("charged " + args + " for " + tenant), nil
		}, idem.WithCallScope(tenant), idem.WithCallFingerprint([]byte(args)))
		return string(res), err
	}
	fmt.Println(charge("acme", "charge-1", "10 EUR"))
	fmt.Println(charge("acme", "charge-1", "10 EUR")) // the stored result
	_, err := charge("acme", "charge-1", "99 EUR")
	fmt.Println(errors.Is(err, idem.ErrMismatch))
	fmt.Println(charge("globex", "charge-1", "99 EUR")) // another tenant's key
	// Output:
	// charged 10 EUR for acme <nil>
	// charged 10 EUR for acme <nil>
	// true
	// charged 99 EUR for globex <nil>
}

// The application's authentication names the principal once it has
// verified the credentials: the default scope. A client whose access token
// is refreshed between two attempts stays in its scope, and its retry is
// replayed; a request with credentials that no authentication verified is
// refused (500 ErrScopeUnknown) rather than scoped by a guess.
func ExampleContextWithPrincipal() {
	store := memstore.New()
	defer store.Close()
	m, _ := idem.New(store)
	subjects := map[string]string{"Bearer t1": "alice", "Bearer t2": "alice"} // the token verifier's answers
	authenticate := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			sub, ok := subjects[r.Header.Get("Authorization")]
			if !ok {
				http.Error(w, "unauthenticated", http.StatusUnauthorized)
				return
			}
			next.ServeHTTP(w, r.WithContext(idem.ContextWithPrincipal(r.Context(), sub)))
		})
	}
	orders := 0
	h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		orders++
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "order %d", orders)
	}))
	send := func(h http.Handler, token string) {
		r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"item":"book"}`))
		r.Header.Set("Authorization", token)
		r.Header.Set("Idempotency-Key", "order-42")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Header().Get("Idempotent-Replayed"), strings.TrimSpace(w.Body.String())[:7])
	}
	send(authenticate(h), "Bearer t1") // runs
	send(authenticate(h), "Bearer t2") // the token was refreshed: replayed
	send(h, "Bearer t1")               // no authentication before idem: refused
	fmt.Println("orders:", orders)
	// Output:
	// 201  order 1
	// 201 true order 1
	// 500  {"type"
	// orders: 1
}
