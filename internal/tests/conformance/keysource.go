package conformance

import (
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/idemkit/idem"
)

// The scenarios of this file take the key from the request (WithKey), as
// payment providers' callbacks and webhooks carry it: the handler reads
// the body (or the form) the middleware read before it, and each event
// runs once whatever the number of deliveries.
func init() { scenarios = append(scenarios, keySourceScenarios...) }

// delivery is one sending of a callback: its body, type and headers.
type delivery struct {
	body, ctype string
	header      http.Header
}

func (e *env) deliver(d delivery) reply {
	e.t.Helper()
	h := http.Header{"Content-Type": {d.ctype}}
	for k, v := range d.header {
		h[k] = v
	}
	return e.do(req{path: "/hook", body: d.body, header: h})
}

// redelivered sends first, then each of again, and checks that the
// handler ran once and every later delivery got the first's response.
func redelivered(t *testing.T, s *suite, src idem.KeySource, h http.HandlerFunc, first delivery, again ...delivery) {
	t.Helper()
	var c counter
	e := s.env([]Route{{"POST", "/hook", c.wrap(h)}}, idem.WithKey(src))
	orig := e.deliver(first)
	if orig.status != http.StatusOK {
		t.Fatalf("first delivery: %v", orig)
	}
	for _, d := range again {
		sameResponse(t, orig, e.deliver(d))
	}
	c.want(t, 1)
}

var keySourceScenarios = []scenario{
	// A Stripe-like event: the key is the JSON body's id; a redelivery
	// differs in its delivery attempt, which the default (no request
	// comparison with WithKey) accepts.
	{"KeyFromJSON", func(t *testing.T, s *suite) {
		redelivered(t, s, idem.KeyFromJSON("id"), func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			info, _ := idem.FromContext(r.Context())
			fmt.Fprintf(w, "event %s handled, body %s", info.Key, body)
		},
			delivery{body: `{"id":"evt_1","attempt":1}`, ctype: "application/json"},
			delivery{body: `{"id":"evt_1","attempt":2}`, ctype: "application/json"},
			delivery{body: `{"id":"evt_1","attempt":3}`, ctype: "application/json"})
	}},
	// An Alipay-like notification: a form body, keyed by two fields; the
	// handler reads the form (the body the middleware buffered).
	{"KeyFromForm", func(t *testing.T, s *suite) {
		d := delivery{body: "notify_time=2025-01-01+10%3A00%3A00&trade_no=2013112011001004330000121536&trade_status=TRADE_SUCCESS&total_amount=88.88",
			ctype: "application/x-www-form-urlencoded"}
		later := d
		later.body = "notify_time=2025-01-01+10%3A00%3A09&trade_no=2013112011001004330000121536&trade_status=TRADE_SUCCESS&total_amount=88.88"
		redelivered(t, s, idem.KeyFromForm("trade_no", "trade_status"), func(w http.ResponseWriter, r *http.Request) {
			if err := r.ParseForm(); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			info, _ := idem.FromContext(r.Context())
			fmt.Fprintf(w, "success %s %s", info.Key, r.PostForm.Get("total_amount"))
		}, d, later, d)
	}},
	// A GitHub-like delivery: the key is a header of its own.
	{"KeyFromHeader", func(t *testing.T, s *suite) {
		d := delivery{body: `{"action":"opened"}`, ctype: "application/json", header: http.Header{"X-Github-Delivery": {"72d3162e-cc78-11e3-81ab-4c9367dc0958"}}}
		redelivered(t, s, idem.KeyFromHeader("X-GitHub-Delivery"), func(w http.ResponseWriter, r *http.Request) {
			info, _ := idem.FromContext(r.Context())
			fmt.Fprintf(w, "delivery %s", info.Key)
		}, d, d)
	}},
	// Without the key where the source looks, a 400 problem, and the
	// handler does not run.
	{"KeySourceMissing", func(t *testing.T, s *suite) {
		var c counter
		e := s.env([]Route{{"POST", "/hook", c.wrap(func(w http.ResponseWriter, r *http.Request) {})}}, idem.WithKey(idem.KeyFromJSON("id")))
		problem(t, e.deliver(delivery{body: `{"type":"x"}`, ctype: "application/json"}), 400, idem.ErrMissingKey)
		problem(t, e.deliver(delivery{body: `not json`, ctype: "application/json"}), 400, idem.ErrInvalidKey)
		c.want(t, 0)
	}},
}
