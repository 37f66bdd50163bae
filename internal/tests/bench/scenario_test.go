package bench

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage/memstore"
)

// scenarioJSON is the 205-byte body of the scenario's POST.
var scenarioJSON = []byte(`{"customer":"c_8d2f","currency":"EUR","items":[{"sku":"A-1","qty":2,"price":"49.95"},{"sku":"B-7","qty":1,"price":"30.00"}],"shipping":{"method":"standard","country":"DE"},"note":"leave at the front door"}`)

// scenarioOrder is what the scenario's handler decodes.
type scenarioOrder struct {
	Customer string `json:"customer"`
	Currency string `json:"currency"`
	Items    []struct {
		SKU   string `json:"sku"`
		Qty   int    `json:"qty"`
		Price string `json:"price"`
	} `json:"items"`
	Shipping struct {
		Method  string `json:"method"`
		Country string `json:"country"`
	} `json:"shipping"`
	Note string `json:"note"`
}

// BenchmarkScenario is the side-by-side scenario that Go idempotency
// middlewares are compared in: each request built anew (httptest's
// request and recorder), a 205-byte JSON POST that the handler decodes,
// a 201 with a 200-byte JSON answer, idem with its defaults on net/http
// and the memory store. bare is the handler alone; first a new key each
// request; replay one key again and again. first and replay report
// their cost over bare and that cost as a multiple of bare (x-bare).
func BenchmarkScenario(b *testing.B) {
	if len(scenarioJSON) != 205 || len(orderJSON) != 200 {
		b.Fatalf("bodies of %d and %d bytes, want 205 and 200", len(scenarioJSON), len(orderJSON))
	}
	// The handler reads the body, as every handler that takes one does;
	// decode decodes it too, as an order endpoint does.
	read := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		answer(w)
	})
	decode := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var o scenarioOrder
		if err := json.NewDecoder(r.Body).Decode(&o); err != nil || len(o.Items) != 2 {
			http.Error(w, "bad order", http.StatusBadRequest)
			return
		}
		answer(w)
	})
	store := memstore.New()
	b.Cleanup(func() { store.Close() })
	m, err := idem.New(store)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Shutdown(b.Context()) })
	send := func(h http.Handler, key string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/orders", bytes.NewReader(scenarioJSON))
		r.Header.Set("Content-Type", "application/json")
		if key != "" {
			r.Header.Set("Idempotency-Key", key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	for _, hc := range []struct {
		name    string
		handler http.Handler
	}{{"read", read}, {"decode", decode}} {
		b.Run(hc.name, func(b *testing.B) {
			protected := nethttp.Middleware(m)(hc.handler)
			var bare float64
			run := func(name string, h http.Handler, key func() string, replayed bool) {
				b.Run(name, func(b *testing.B) {
					b.ReportAllocs()
					var w *httptest.ResponseRecorder
					for b.Loop() {
						w = send(h, key())
					}
					if w.Code != http.StatusCreated || (w.Header().Get("Idempotent-Replayed") == "true") != replayed {
						b.Fatalf("%s: got %d, replayed %q", name, w.Code, w.Header().Get("Idempotent-Replayed"))
					}
					ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
					if name == "bare" {
						bare = ns
						return
					}
					if bare > 0 {
						b.ReportMetric(ns-bare, "ns-over-bare/op")
						b.ReportMetric((ns-bare)/bare, "x-bare")
					}
				})
			}
			run("bare", hc.handler, func() string { return "" }, false)
			run("first", protected, func() string { return "order-" + strconv.FormatUint(keySeq.Add(1), 10) }, false)
			replayKey := "order-" + strconv.FormatUint(keySeq.Add(1), 10)
			send(protected, replayKey)
			run("replay", protected, func() string { return replayKey }, true)
		})
	}
}

// answer writes the scenario's answer: 201 and the 200-byte order.
func answer(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", location)
	w.WriteHeader(http.StatusCreated)
	w.Write(orderJSON)
}
