package idemclient_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage/memstore"
)

// orderServer serves POST /orders behind the kit's middleware. The handler
// fails with a 500 the first time (the middleware then releases the key)
// and creates the order afterwards. runs counts its executions.
func orderServer(runs *atomic.Int64) (*httptest.Server, func()) {
	store := memstore.New()
	m, err := idem.New(store)
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			http.Error(w, "database hiccup", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"order":42}`)
	})))
	srv := httptest.NewServer(mux)
	return srv, func() { srv.Close(); store.Close() }
}

func ExampleNew() {
	var runs atomic.Int64
	srv, stop := orderServer(&runs)
	defer stop()

	client := &http.Client{
		Transport: idemclient.New(idemclient.WithBackoff(10*time.Millisecond, 100*time.Millisecond)),
		Timeout:   30 * time.Second, // bounds the attempts and the waits too
	}
	resp, err := client.Post(srv.URL+"/orders", "application/json", strings.NewReader(`{"item":"book"}`))
	if err != nil {
		log.Fatal(err) // it may have run once, never twice
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	res, _ := idemclient.ResultOf(resp)
	fmt.Println(resp.StatusCode, string(body))
	fmt.Println("attempts:", res.Attempts, "replayed:", res.Replayed, "handler runs:", runs.Load())
	// Output:
	// 201 {"order":42}
	// attempts: 2 replayed: false handler runs: 2
}

// A job that stored its key with the operation resumes after a restart of
// its process: the same key gets the response of the first run.
func ExampleWithKey() {
	var runs atomic.Int64
	runs.Store(1) // no failure in this example
	srv, stop := orderServer(&runs)
	defer stop()

	key := idemclient.NewKey() // saved with the job before the first attempt
	ctx := idemclient.WithKey(context.Background(), key)
	for run := 1; run <= 2; run++ { // two processes, one after the other
		client := &http.Client{Transport: idemclient.New()}
		req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/orders", strings.NewReader(`{"item":"book"}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		res, _ := idemclient.ResultOf(resp)
		fmt.Printf("run %d: %d %s replayed=%v same key=%v\n", run, resp.StatusCode, body, res.Replayed, res.Key == key)
	}
	fmt.Println("orders created:", runs.Load()-1)
	// Output:
	// run 1: 201 {"order":42} replayed=false same key=true
	// run 2: 201 {"order":42} replayed=true same key=true
	// orders created: 1
}

func ExampleWithAttemptHook() {
	var runs atomic.Int64
	srv, stop := orderServer(&runs)
	defer stop()

	tr := idemclient.New(
		idemclient.WithBackoff(10*time.Millisecond, 100*time.Millisecond),
		idemclient.WithAttemptHook(func(a idemclient.Attempt) {
			// A log line or a metric; the key is never in an Attempt.
			fmt.Printf("attempt %d: %s %s -> %d retry=%v\n", a.N, a.Method, a.URL.Path, a.StatusCode, a.Retry)
		}),
	)
	client := &http.Client{Transport: tr}
	resp, err := client.Post(srv.URL+"/orders", "application/json", strings.NewReader(`{}`))
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	// Output:
	// attempt 1: POST /orders -> 500 retry=true
	// attempt 2: POST /orders -> 201 retry=false
}
