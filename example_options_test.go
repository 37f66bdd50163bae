package idem_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"sync"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage/memstore"
)

// With WithWait, a duplicate that arrives while the first request runs
// waits for it and gets its response, instead of 409.
func ExampleWithWait() {
	store := memstore.New()
	defer store.Close()
	m, err := idem.New(store, idem.WithWait(5*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	started, release, second := make(chan struct{}), make(chan struct{}), make(chan struct{})
	handler := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started) // runs once: a second run would panic here
		<-release
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, "order 1")
	}))
	var requests sync.WaitGroup
	requests.Add(2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Done() // both have reached the server once second is closed
		handler.ServeHTTP(w, r)
	}))
	defer srv.Close()
	go func() { requests.Wait(); close(second) }()

	var wg sync.WaitGroup
	wg.Go(func() { post(srv.URL, "k-1", "book") }) // the first: runs the handler
	<-started
	wg.Go(func() { post(srv.URL, "k-1", "book") }) // the duplicate: waits, then gets the replay
	<-second
	close(release)
	wg.Wait()
	// Unordered output:
	// 201 replayed="" order 1
	// 201 replayed="true" order 1
}

// WithRebuild answers the retry of a request whose response was not kept
// (here: larger than WithMaxResponseBody) from the application's own data,
// instead of 409 ErrNotReplayable. The handler does not run again.
func ExampleWithRebuild() {
	store := memstore.New()
	defer store.Close()
	orders := map[string]int{} // the application's data, by the request's storage key
	m, err := idem.New(store, idem.WithMaxResponseBody(16),
		idem.WithRebuild(func(w http.ResponseWriter, r *http.Request) bool {
			info, _ := idem.FromContext(r.Context())
			id, ok := orders[info.StorageKey]
			if !ok {
				return false // the usual 409
			}
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, "order %d (rebuilt)", id)
			return true
		}))
	if err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewServer(nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, _ := idem.FromContext(r.Context())
		orders[info.StorageKey] = len(orders) + 1
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "order %d, with a receipt too large to keep", len(orders))
	})))
	defer srv.Close()

	post(srv.URL, "k-1", "book")
	post(srv.URL, "k-1", "book")
	fmt.Println("orders:", len(orders))
	// Output:
	// 201 replayed="" order 1, with a receipt too large to keep
	// 201 replayed="true" order 1 (rebuilt)
	// orders: 1
}

// WithErrorWriter replaces the RFC 9457 problem body of every refusal;
// errors.Is tells the refusals apart.
func ExampleWithErrorWriter() {
	store := memstore.New()
	defer store.Close()
	m, err := idem.New(store, idem.WithErrorWriter(func(w http.ResponseWriter, r *http.Request, e *idem.Error) {
		if e.RetryAfter > 0 {
			w.Header().Set("Retry-After", fmt.Sprint(int(e.RetryAfter.Seconds())))
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(e.Status)
		json.NewEncoder(w).Encode(map[string]any{
			"error":  e.Title,
			"reused": errors.Is(e, idem.ErrMismatch),
		})
	}))
	if err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewServer(nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})))
	defer srv.Close()

	post(srv.URL, "k-1", "book")
	req, _ := http.NewRequest(http.MethodPost, srv.URL, nil)
	req.Header.Set("Idempotency-Key", "k-1") // the same key, another body
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	defer res.Body.Close()
	var body map[string]any
	json.NewDecoder(res.Body).Decode(&body)
	fmt.Println(res.StatusCode, body["error"], body["reused"])
	// Output:
	// 201 replayed=""
	// 422 Idempotency key reused true
}

// Shutdown waits until every execution has stored its response (or
// released its key), background retries included. The order: stop taking
// requests and let the handlers return (http.Server.Shutdown), then
// Middleware.Shutdown, then close the store.
func ExampleMiddleware_Shutdown() {
	store := memstore.New()
	m, err := idem.New(store)
	if err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewServer(nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})))
	post(srv.URL, "k-1", "book")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srv.Close()                             // 1. the server: no new request, every handler returned
	if err := m.Shutdown(ctx); err != nil { // 2. idem: every record stored
		log.Print(err) // some keys stay locked until their lease ends
	}
	store.Close() // 3. the store
	fmt.Println("shut down in order")
	// Output:
	// 201 replayed=""
	// shut down in order
}
