package democlient_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/democlient"
	"github.com/idemkit/idem/internal/leakcheck"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage/memstore"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

// TestBurst: a burst of identical requests passes Burst's check behind
// idem (on the memory store: no database needed), and fails it without the
// middleware, where the handler runs for each.
func TestBurst(t *testing.T) {
	var runs atomic.Int64
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", "/orders/1")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "run %d\n", runs.Add(1))
	})
	store := memstore.New()
	defer store.Close()
	m, err := idem.New(store)
	if err != nil {
		t.Fatal(err)
	}
	protected := httptest.NewServer(nethttp.Middleware(m)(handler))
	defer protected.Close()
	var out strings.Builder
	if err := democlient.Burst(&out, protected.URL, "burst", `{"item":"lamp","amount":40}`, 6); err != nil {
		t.Fatalf("%v\ntranscript:\n%s", err, out.String())
	}
	if got := out.String(); !strings.Contains(got, "6 identical requests at once") || !strings.Contains(got, "HTTP 201") ||
		!regexp.MustCompile(`the 5 others: \d x 201 with Idempotent-Replayed: true and this body, \d x 409`).MatchString(got) {
		t.Errorf("transcript:\n%s", got)
	}

	bare := httptest.NewServer(handler)
	defer bare.Close()
	err = democlient.Burst(io.Discard, bare.URL, "burst", "{}", 3)
	if err == nil || !strings.Contains(err.Error(), "the handler answered 3 of them, want 1") {
		t.Errorf("without the middleware: %v, want an error: the handler answered 3", err)
	}
}
