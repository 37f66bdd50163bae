package idemclient

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// benchBody is the request body of the benchmarks: a small JSON order.
const benchBody = `{"item":"book","amount":12}`

// BenchmarkTransport measures what the transport adds to a successful
// request over http.DefaultTransport, against a local server that reads
// the body and answers 201 with a small body (not the kit: only the
// client's side is measured). Each iteration is one POST, its response
// read and closed. The allocations counted are the whole process's: the
// server's too.
//
//	bare       http.DefaultTransport alone
//	bare-key   http.DefaultTransport alone, the request carrying a key header:
//	           the header's own cost on the wire and in the server
//	generated  idemclient over it, the key generated (the common case)
//	header     idemclient, the key in the request's header (no header copy)
//	buffered   idemclient, a body without GetBody (read into memory first)
//
//	go test -run '^$' -bench BenchmarkTransport -benchmem -count 6 ./idemclient/
func BenchmarkTransport(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"order":1}`)
	}))
	defer srv.Close()
	defer http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	url := srv.URL + "/orders"
	idem := New() // over http.DefaultTransport

	for _, c := range []struct {
		name   string
		rt     http.RoundTripper
		header bool
		noGet  bool
	}{
		{"bare", http.DefaultTransport, false, false},
		{"bare-key", http.DefaultTransport, true, false},
		{"generated", idem, false, false},
		{"header", idem, true, false},
		{"buffered", idem, false, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			client := &http.Client{Transport: c.rt}
			b.ReportAllocs()
			for b.Loop() {
				var body io.Reader = strings.NewReader(benchBody)
				if c.noGet {
					body = onlyReader{body}
				}
				req, err := http.NewRequest(http.MethodPost, url, body)
				if err != nil {
					b.Fatal(err)
				}
				req.Header.Set("Content-Type", "application/json")
				if c.header {
					req.Header.Set("Idempotency-Key", "order-1")
				}
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusCreated {
					b.Fatalf("status %d", resp.StatusCode)
				}
			}
		})
	}
}

// The transport's own allocations on a successful request, measured over a
// base that answers at once: the budget that BenchmarkTransport's
// difference to bare reflects, without the network's noise.
func TestAllocationBudget(t *testing.T) {
	if raceEnabled {
		t.Skip("allocations are not measured under the race detector")
	}
	resp := &http.Response{StatusCode: http.StatusCreated, Header: http.Header{}, Body: http.NoBody}
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		resp.Request = r
		return resp, nil
	})
	tr := New(WithBase(base))
	for _, c := range []struct {
		name   string
		header bool
		budget float64
	}{
		// The call (Result and context), the request copy, the key, the
		// header map copy (its table and one group).
		{"generated", false, 5},
		// The call and the request copy.
		{"header", true, 2},
	} {
		req, _ := http.NewRequest(http.MethodPost, "http://example.com/orders", nil)
		req.Header.Set("Content-Type", "application/json")
		if c.header {
			req.Header.Set("Idempotency-Key", "order-1")
		}
		got := testing.AllocsPerRun(1000, func() {
			if _, err := tr.RoundTrip(req); err != nil {
				t.Fatal(err)
			}
		})
		if got > c.budget {
			t.Errorf("%s: %v allocations per request, budget %v", c.name, got, c.budget)
		}
		t.Logf("%s: %v allocations per request", c.name, got)
	}
}
