package idem_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/nethttp"
)

// readSizes records the size of every buffer a reader is asked to fill.
type readSizes struct {
	r     io.Reader
	sizes []int
}

func (r *readSizes) Read(p []byte) (int, error) {
	r.sizes = append(r.sizes, len(p))
	return r.r.Read(p)
}

// The body's buffer grows as bytes arrive: a request that declares a
// large Content-Length is not given a buffer of that size before a byte
// arrives. On the main before this fix the first read was offered 1 MiB
// (Content-Length + 1), so 64 connections that sent only their headers
// held 64 MiB. The handler still reads the whole body, for every size.
func TestBodyBufferGrowsAsBytesArrive(t *testing.T) {
	mem, _ := newMemStore(t)
	m, err := idem.New(mem, idem.WithMaxRequestBody(2<<20))
	if err != nil {
		t.Fatal(err)
	}
	var got string
	h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = string(b)
		w.WriteHeader(201)
	}))
	for _, n := range []int{0, 1, 4095, 4096, 4097, 100_000, 1 << 20} {
		body := strings.Repeat("x", n)
		for _, declared := range []bool{true, false} {
			src := &readSizes{r: strings.NewReader(body)}
			r := httptest.NewRequest(http.MethodPost, "/orders", nil)
			r.Body = io.NopCloser(src)
			r.ContentLength = -1
			if declared {
				r.ContentLength = int64(n)
			}
			r.Header.Set("Idempotency-Key", fmt.Sprint("k-", n, declared))
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != 201 || got != body {
				t.Fatalf("%d bytes (declared %v): %d, handler read %d bytes", n, declared, w.Code, len(got))
			}
			if len(src.sizes) > 0 && src.sizes[0] > 4096 {
				t.Fatalf("%d bytes (declared %v): the first read was offered %d bytes before any arrived", n, declared, src.sizes[0])
			}
			for _, s := range src.sizes {
				if declared && s > n+1 {
					t.Fatalf("%d bytes declared: a read was offered %d bytes", n, s)
				}
			}
		}
	}
}
