package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestLatency measures what the gateway adds over the bare
// httputil.ReverseProxy, both in the same binary against the same
// upstream: a route with protect: [] is the bare proxy behind the
// gateway's mux. It prints p50 and p99 at 1 and 64 concurrent clients and
// the requests a second, for POSTs with a new key each (first
// executions), the same keys again (replays), and the bare proxy. It
// asserts nothing: run it by hand, on an idle machine,
//
//	IDEM_GATEWAY_LATENCY=3s go test -run TestLatency -v ./cmd/idem-gateway
//
// (the value is each phase's length); docs/performance.md has its
// figures.
func TestLatency(t *testing.T) {
	phase, err := time.ParseDuration(os.Getenv("IDEM_GATEWAY_LATENCY"))
	if err != nil {
		t.Skip("IDEM_GATEWAY_LATENCY (a phase's length, as 3s) is not set")
	}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"order":1,"item":"book"}`+"\n")
	}))
	defer up.Close()
	upstreamURL := up.URL
	gw := startGateway(t, fmt.Sprintf(`listen: [{address: "127.0.0.1:0"}]
store: {memory: {}}
upstreams: {app: {url: %q, max_idle_conns: 256}}
routes:
  - {match: "POST /orders", upstream: app, scope: {none: true}}
  - {match: "POST /bare", upstream: app, protect: []}
`, upstreamURL))
	fmt.Printf("| what | clients | req/s | p50 | p99 |\n|---|---|---|---|---|\n")
	for _, clients := range []int{1, 64} {
		for _, c := range []struct {
			name, path string
			key        func(worker, i int) string
		}{
			{"bare httputil.ReverseProxy", "/bare", func(int, int) string { return "" }},
			{"gateway, first executions", "/orders", func(w, i int) string { return fmt.Sprintf("first-%d-%d-%d", clients, w, i) }},
			{"gateway, replays", "/orders", func(w, i int) string { return fmt.Sprintf("first-%d-%d-%d", clients, w, i%64) }},
		} {
			n, lat := load(t, gw.url(c.path), clients, phase, c.key)
			fmt.Printf("| %s | %d | %.0f | %v | %v |\n", c.name, clients, float64(n)/phase.Seconds(),
				percentile(lat, 0.50), percentile(lat, 0.99))
		}
	}
}

// load sends POSTs from clients workers for d and returns how many were
// answered and their latencies.
func load(t testing.TB, url string, clients int, d time.Duration, key func(worker, i int) string) (int, []time.Duration) {
	tr := &http.Transport{MaxIdleConnsPerHost: clients, MaxConnsPerHost: clients}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var mu sync.Mutex
	var all []time.Duration
	var failed atomic.Int64
	var wg sync.WaitGroup
	for w := range clients {
		wg.Go(func() {
			var lat []time.Duration
			for i := 0; ctx.Err() == nil; i++ {
				req, _ := http.NewRequest("POST", url, strings.NewReader(`{"item":"book"}`))
				req.Header.Set("Content-Type", "application/json")
				if k := key(w, i); k != "" {
					req.Header.Set("Idempotency-Key", k)
				}
				start := time.Now()
				res, err := c.Do(req)
				if err != nil {
					failed.Add(1)
					continue
				}
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
				if res.StatusCode != http.StatusCreated {
					failed.Add(1)
					continue
				}
				lat = append(lat, time.Since(start))
			}
			mu.Lock()
			all = append(all, lat...)
			mu.Unlock()
		})
	}
	wg.Wait()
	if f := failed.Load(); f > 0 {
		t.Errorf("%s: %d requests failed", url, f)
	}
	return len(all), all
}

func percentile(lat []time.Duration, p float64) string {
	if len(lat) == 0 {
		return "-"
	}
	slices.Sort(lat)
	d := lat[min(len(lat)-1, int(float64(len(lat))*p))]
	return strconv.FormatFloat(float64(d.Microseconds()), 'f', 0, 64) + " µs"
}
