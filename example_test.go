package idem_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage/memstore"
)

// post sends a POST with an Idempotency-Key and prints what came back.
func post(url, key, body string) {
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Idempotency-Key", key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.Header.Get("Content-Type") == "application/problem+json" {
		b = []byte(res.Header.Get("Content-Type"))
	}
	fmt.Println(strings.TrimSpace(fmt.Sprintf("%d replayed=%q %s", res.StatusCode, res.Header.Get("Idempotent-Replayed"), b)))
}

func ExampleNew() {
	store := memstore.New() // one process; redisstore.New(rdb) for every instance of a service
	defer store.Close()
	m, err := idem.New(store) // POST and PATCH with an Idempotency-Key; responses kept 24 h
	if err != nil {
		log.Fatal(err)
	}

	charges := 0
	mux := http.NewServeMux()
	mux.Handle("POST /charges", nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"charge":%d}`, charges)
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	post(srv.URL+"/charges", "charge-7", `{"amount":100}`) // runs the handler
	post(srv.URL+"/charges", "charge-7", `{"amount":100}`) // a retry: replayed
	post(srv.URL+"/charges", "charge-7", `{"amount":500}`) // same key, other request: 422
	fmt.Println("charges:", charges)
	// Output:
	// 201 replayed="" {"charge":1}
	// 201 replayed="true" {"charge":1}
	// 422 replayed="" application/problem+json
	// charges: 1
}

func ExampleFromContext() {
	store := memstore.New()
	defer store.Close()
	m, err := idem.New(store)
	if err != nil {
		log.Fatal(err)
	}
	h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, ok := idem.FromContext(r.Context())
		// info.Owner is a fencing token: write it with the business change,
		// in the same transaction, to reject a stale execution's write.
		fmt.Printf("ok=%v key=%q protected=%v owner-length=%d\n", ok, info.Key, info.Protected, len(info.Owner))
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()

	post(srv.URL, `"order-1"`, "") // an RFC 8941 string: the key is order-1
	// Output:
	// ok=true key="order-1" protected=true owner-length=32
	// 200 replayed=""
}

func ExampleWithObserver() {
	store := memstore.New()
	defer store.Close()
	m, err := idem.New(store, idem.WithObserver(func(e idem.Event) {
		// Feed a metric, a trace or a log: the event never holds the key
		// or credentials.
		fmt.Printf("event: %s %s %s %d\n", e.Method, e.Route, e.Outcome, e.Status)
	}))
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders/{id}/pay", nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusAccepted)
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	post(srv.URL+"/orders/1/pay", "k", "")
	post(srv.URL+"/orders/1/pay", "k", "")
	post(srv.URL+"/orders/1/pay", "k", "changed")
	// Output:
	// event: POST /orders/{id}/pay executed 202
	// 202 replayed=""
	// event: POST /orders/{id}/pay replayed 202
	// 202 replayed="true"
	// event: POST /orders/{id}/pay mismatch 422
	// 422 replayed="" application/problem+json
}

func ExampleWithKey() {
	store := memstore.New()
	defer store.Close()
	// A payment provider's event carries its id in the JSON body, and the
	// provider delivers it again until it gets a 2xx. (Verify its signature
	// before the middleware.)
	m, err := idem.New(store, idem.WithKey(idem.KeyFromJSON("id")))
	if err != nil {
		log.Fatal(err)
	}
	captured := 0
	h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		captured++
		info, _ := idem.FromContext(r.Context())
		fmt.Fprintf(w, "event %s handled", info.Key)
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()

	deliver := func(body string) {
		res, err := http.Post(srv.URL, "application/json", strings.NewReader(body))
		if err != nil {
			log.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		fmt.Printf("%d replayed=%q %s\n", res.StatusCode, res.Header.Get("Idempotent-Replayed"), b)
	}
	deliver(`{"id":"evt_1","attempt":1}`)
	deliver(`{"id":"evt_1","attempt":2}`) // redelivered: no second capture
	fmt.Println("captured:", captured)
	// Output:
	// 200 replayed="" event evt_1 handled
	// 200 replayed="true" event evt_1 handled
	// captured: 1
}

func ExampleMiddleware_Do() {
	store := memstore.New() // redisstore for consumers in several processes
	defer store.Close()
	m, err := idem.New(store)
	if err != nil {
		log.Fatal(err)
	}
	// A queue delivers a message at least once: the message id is the key.
	credited := 0
	handle := func(msgID string) {
		res, err := m.Do(context.Background(), "payments-queue", msgID, func(ctx context.Context) ([]byte, error) {
			credited++ // the side effect
			return fmt.Appendf(nil, "credited, entry %d", credited), nil
		})
		if err != nil {
			fmt.Println("leave the message for redelivery:", err)
			return
		}
		fmt.Printf("ack %s: %s\n", msgID, res)
	}
	handle("1700000000000-0")
	handle("1700000000000-0") // redelivered: the stored result, no second credit
	fmt.Println("credited:", credited)
	// Output:
	// ack 1700000000000-0: credited, entry 1
	// ack 1700000000000-0: credited, entry 1
	// credited: 1
}

func ExampleMiddleware_IssueKey() {
	store := memstore.New()
	defer store.Close()
	// Only keys this server issued, to the same client (the default scope:
	// the principal that the authentication names with
	// idem.ContextWithPrincipal; anonymous here), for 30 minutes.
	m, err := idem.New(store, idem.WithIssuedKeys(30*time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	orders := 0
	mux := http.NewServeMux()
	mux.HandleFunc("GET /checkout", func(w http.ResponseWriter, r *http.Request) {
		key, err := m.IssueKey(r) // one store round trip
		if err != nil {
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, key) // in a real page: a hidden form field
	})
	mux.Handle("POST /orders", nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		orders++
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "order %d", orders)
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	res, err := http.Get(srv.URL + "/checkout")
	if err != nil {
		log.Fatal(err)
	}
	key, _ := io.ReadAll(res.Body)
	res.Body.Close()
	post(srv.URL+"/orders", string(key), "1 book")                      // the first submit takes the key
	post(srv.URL+"/orders", string(key), "1 book")                      // a double submit: replayed
	post(srv.URL+"/orders", "A-KEY-THIS-SERVER-NEVER-ISSUED", "1 book") // 400 ErrKeyNotIssued
	fmt.Println("orders:", orders)
	// Output:
	// 201 replayed="" order 1
	// 201 replayed="true" order 1
	// 400 replayed="" application/problem+json
	// orders: 1
}

// A handler whose work may have taken effect although it must answer an
// error (a charge sent to a provider whose reply was lost) marks the
// execution done: the 502 does not release the key, and the retry gets 409
// instead of a second charge.
func ExampleMarkDone() {
	store := memstore.New()
	defer store.Close()
	m, err := idem.New(store)
	if err != nil {
		log.Fatal(err)
	}
	charges := 0
	h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges++ // the charge request went out; its reply never came back
		idem.MarkDone(r.Context())
		http.Error(w, "payment provider timed out", http.StatusBadGateway)
	}))
	for range 2 {
		r := httptest.NewRequest(http.MethodPost, "/charges", nil)
		r.Header.Set("Idempotency-Key", "charge-1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(w.Code)
	}
	fmt.Println("charges sent:", charges)
	// Output:
	// 502
	// 409
	// charges sent: 1
}
