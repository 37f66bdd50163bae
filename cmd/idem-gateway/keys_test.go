package main

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// A provider's callbacks keyed by its ids: a JSON member and a form field.
// A redelivery whose body differs in a timestamp is the same event; a
// callback without its id gets 400; a body over the limit 413; a status
// that is not cacheable releases the key for the next delivery.
func TestProcessKeySources(t *testing.T) {
	up := newUpstream(t)
	gw := startGateway(t, memoryConfig(up, `    protect: [POST]
  - match: POST /hooks/stripe
    upstream: app
    key: {json: data.object.id}
    scope: {none: true}
    max_request_body: 64
  - match: POST /hooks/alipay
    upstream: app
    key: {form: trade_no}
    scope: {none: true}
    cacheable: ["200-299"]
`))
	ctx := deadline(t, time.Minute)
	c := &http.Client{}
	event := func(ts int) string { return fmt.Sprintf(`{"created":%d,"data":{"object":{"id":"evt_1"}}}`, ts) }
	first := post(ctx, c, gw.url("/hooks/stripe"), "", event(1))
	again := settled(ctx, c, gw.url("/hooks/stripe"), "", event(2))
	if first.status != http.StatusCreated || !again.replayed || again.body != first.body {
		t.Fatalf("a redelivery: %v then %v, want it replayed", first, again)
	}
	if a := post(ctx, c, gw.url("/hooks/stripe"), "", `{"data":{}}`); a.status != http.StatusBadRequest {
		t.Fatalf("a callback without its id: %v, want 400", a)
	}
	if a := post(ctx, c, gw.url("/hooks/stripe"), "", `{"data":{"object":{"id":"evt_2"}},"pad":"`+strings.Repeat("x", 64)+`"}`); a.status != http.StatusRequestEntityTooLarge {
		t.Fatalf("a body over max_request_body: %v, want 413", a)
	}

	form := func(fail bool) answer {
		v := url.Values{"trade_no": {"T100"}, "sign": {"s"}}
		req, _ := http.NewRequestWithContext(ctx, "POST", gw.url("/hooks/alipay"), strings.NewReader(v.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if fail {
			req.Header.Set("X-Upstream-Status", "409") // not cacheable on this route
		}
		res, err := c.Do(req)
		if err != nil {
			return answer{err: err}
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return answer{status: res.StatusCode, header: res.Header, body: string(b), replayed: res.Header.Get("Idempotent-Replayed") == "true"}
	}
	if a := form(true); a.status != http.StatusConflict || a.replayed {
		t.Fatalf("first delivery: %v", a)
	}
	if a := form(false); a.status != http.StatusCreated || a.replayed {
		t.Fatalf("the next delivery after a 409 that is not kept: %v, want it sent on", a)
	}
	a := form(false)
	for inFlight(a) && ctx.Err() == nil { // its record may be stored just after its answer went out
		time.Sleep(20 * time.Millisecond)
		a = form(false)
	}
	if !a.replayed {
		t.Fatalf("a third delivery: %v, want a replay", a)
	}
}
