package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/memstore"
)

var (
	testSecrets   = secrets{stripe: []byte("whsec_test"), alipay: []byte("alipay-test-key"), github: []byte("github-test-secret")}
	forgedSecrets = secrets{stripe: []byte("whsec_forged"), alipay: []byte("alipay-forged"), github: []byte("github-forged")}
	// t0 is when the tests' Alipay notifications are sent (notify_time).
	t0 = time.Date(2025, 6, 1, 10, 0, 0, 0, time.UTC)
)

// provider makes the deliveries of one receiver.
type provider struct {
	name string
	// deliver is a delivery of the event id signed with s; attempt
	// changes what a provider changes between deliveries (Stripe's
	// pending_webhooks, Alipay's notify_time; GitHub resends as is).
	deliver func(s secrets, id string, attempt int) delivery
	// noID is a delivery signed with s that carries no event id.
	noID func(s secrets) delivery
	// event is the ledger's name of the event id.
	event func(id string) string
}

var providers = []provider{
	{
		name: "stripe",
		deliver: func(s secrets, id string, attempt int) delivery {
			return stripeDelivery(s.stripe, time.Now(), stripeEventJSON(id, 1250, attempt))
		},
		noID: func(s secrets) delivery {
			return stripeDelivery(s.stripe, time.Now(), `{"object":"event","type":"payment_intent.succeeded","data":{"object":{"id":"pi_1"}}}`)
		},
		event: func(id string) string { return "stripe " + id },
	},
	{
		name: "alipay",
		deliver: func(s secrets, id string, attempt int) delivery {
			return alipayDelivery(s.alipay, tradeForm(id, "TRADE_SUCCESS", notified(attempt)))
		},
		noID: func(s secrets) delivery {
			f := tradeForm("2025060122001", "TRADE_SUCCESS", t0)
			f.Del("trade_status")
			return alipayDelivery(s.alipay, f)
		},
		event: func(id string) string { return "alipay " + id + ":TRADE_SUCCESS" },
	},
	{
		name: "github",
		deliver: func(s secrets, id string, _ int) delivery {
			return githubDelivery(s.github, id, `{"action":"opened","issue":{"number":7,"title":"t"},"repository":{"full_name":"acme/shop"}}`)
		},
		noID: func(s secrets) delivery {
			return githubDelivery(s.github, "", `{"action":"opened","issue":{"number":7,"title":"t"},"repository":{"full_name":"acme/shop"}}`)
		},
		event: func(id string) string { return "github " + id },
	},
}

// notified is when the attempt-th notification is sent: attempt minutes
// after t0.
func notified(attempt int) time.Time { return t0.Add(time.Duration(attempt) * time.Minute) }

// server is the receivers on a memory store, served on a loopback port.
type server struct {
	url    string
	ledger *ledger
	store  *memstore.Store
}

// heldStore holds each record it is given (Complete) until release is
// closed, so that the delivery being processed stays in flight; completing
// gets a value for each.
type heldStore struct {
	storage.Store
	completing, release chan struct{}
}

func (s *heldStore) Complete(ctx context.Context, key, owner string, record []byte, ttl time.Duration) error {
	s.completing <- struct{}{}
	<-s.release
	return s.Store.Complete(ctx, key, owner, record, ttl)
}

// serve starts the receivers on a memory store, through held when not nil.
func serve(t *testing.T, held *heldStore) *server {
	t.Helper()
	ms := memstore.New()
	var store storage.Store = ms
	if held != nil {
		held.Store, store = ms, held
	}
	l := newLedger()
	h, middlewares, err := newServer(store, testSecrets, l, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(func() {
		srv.Close()
		for _, m := range middlewares {
			m.Shutdown(t.Context())
		}
		ms.Close()
	})
	return &server{url: srv.URL, ledger: l, store: ms}
}

func (s *server) send(t *testing.T, d delivery) answer {
	t.Helper()
	a, err := send(s.url, d)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// result is the outcome of a delivery sent in the background.
type result struct {
	a   answer
	err error
}

// receive returns the next answer of results, or fails t on an error or
// when none comes within 30 seconds (a handler held for good).
func receive(t *testing.T, results <-chan result) answer {
	t.Helper()
	select {
	case r := <-results:
		if r.err != nil {
			t.Fatal(r.err)
		}
		return r.a
	case <-time.After(30 * time.Second):
		t.Fatal("no answer within 30 seconds")
		return answer{}
	}
}

// TestDemo runs what `go run ./examples/webhooks -demo` runs: on the
// memory store, and twice against one Redis (miniredis), as two runs of
// `-demo -redis host:port` do. Each run's ledger shows each of its five
// events processed once, and only the processed events are stored.
func TestDemo(t *testing.T) {
	check := func(t *testing.T, redisAddr string) {
		t.Helper()
		var out, logw strings.Builder
		if err := run("", redisAddr, true, &out, &logw); err != nil {
			t.Fatalf("%v\ntranscript:\n%s\nlog:\n%s", err, out.String(), logw.String())
		}
		got := out.String()
		_, ledger, ok := strings.Cut(got, "\n# the ledger: each event processed once\n")
		if !ok {
			t.Fatalf("no ledger in the transcript:\n%s", got)
		}
		lines := strings.Split(strings.TrimSpace(ledger), "\n")
		once := regexp.MustCompile(`^1 x (stripe evt_\w+|alipay \w+:TRADE_(SUCCESS|FINISHED)|github [0-9a-f-]{36}): \S`)
		for _, l := range lines {
			if !once.MatchString(l) {
				t.Errorf("ledger line %q: want an event processed once", l)
			}
		}
		if len(lines) != 5 {
			t.Errorf("ledger: %d events, want 5:\n%s", len(lines), ledger)
		}
		for _, want := range []string{"the 3 others: 3 x 409", "Idempotent-Replayed: true", "HTTP 401", "#ErrMissingKey"} {
			if !strings.Contains(got, want) {
				t.Errorf("the transcript lacks %q:\n%s", want, got)
			}
		}
		if n := strings.Count(got, "the 3 others: 3 x 409"); n != 3 {
			t.Errorf("%d bursts with 3 conflicts, want 3 (one per provider):\n%s", n, got)
		}
	}
	t.Run("memory", func(t *testing.T) { check(t, "") })
	t.Run("redis", func(t *testing.T) {
		mr := miniredis.RunT(t)
		for process := range 2 {
			check(t, mr.Addr())
			if n, want := len(mr.Keys()), 5*(process+1); n != want {
				t.Errorf("Redis holds %d keys after %d runs, want %d (the five processed events of each run): %v", n, process+1, want, mr.Keys())
			}
		}
	})
}

// TestConcurrentRedeliveries: 10 deliveries of one event at once, each
// signed anew, with a body that differs in its delivery field, while the
// first is held in flight: the other 9 get 409, the first is processed.
// Then 10 more at once get its answer, replayed. One effect in all.
func TestConcurrentRedeliveries(t *testing.T) {
	const n = 10
	for _, p := range providers {
		t.Run(p.name, func(t *testing.T) {
			held := &heldStore{completing: make(chan struct{}, 2*n), release: make(chan struct{})}
			s := serve(t, held)
			var once bool
			t.Cleanup(func() {
				if !once {
					close(held.release)
				}
			})
			id := p.name + "-evt-1"
			wave := func(attempt int) <-chan result {
				results := make(chan result, n)
				for i := range n {
					go func() {
						a, err := send(s.url, p.deliver(testSecrets, id, attempt+i))
						results <- result{a, err}
					}()
				}
				return results
			}

			results := wave(1)
			for range n - 1 {
				a := receive(t, results)
				if a.status != http.StatusConflict || !bytes.Contains(a.body, []byte("#ErrConflict")) || a.header.Get("Retry-After") == "" {
					t.Fatalf("a duplicate while the first is in flight: %d %q, want 409 ErrConflict with Retry-After", a.status, a.body)
				}
			}
			once = true
			close(held.release)
			first := receive(t, results)
			if err := processed(first); err != nil {
				t.Fatalf("the first delivery: %v (%q)", err, first.body)
			}
			if p.name == "alipay" && string(first.body) != "success" {
				t.Fatalf("alipay's answer %q, want success", first.body)
			}

			results = wave(n + 1)
			for range n {
				if err := replayOf(first)(receive(t, results)); err != nil {
					t.Fatalf("a redelivery after the first: %v", err)
				}
			}
			if len(held.completing) != 1 || s.ledger.times(p.event(id)) != 1 {
				t.Fatalf("%d answers stored, the ledger has the event %d times; want 1 and 1", len(held.completing), s.ledger.times(p.event(id)))
			}
		})
	}
}

// TestForgedDelivery: a delivery signed with another secret, or not
// signed, is refused with 401 before idem: no effect, nothing stored, so
// the genuine delivery of the same event is processed afterwards.
func TestForgedDelivery(t *testing.T) {
	for _, p := range providers {
		t.Run(p.name, func(t *testing.T) {
			s := serve(t, nil)
			id := p.name + "-evt-2"
			unsigned := p.deliver(testSecrets, id, 1)
			unsigned.header = unsigned.header[:1] // Content-Type only
			if p.name == "alipay" {
				form, _ := url.ParseQuery(unsigned.body)
				form.Del("sign")
				unsigned.body = form.Encode()
			}
			for name, d := range map[string]delivery{"forged": p.deliver(forgedSecrets, id, 1), "unsigned": unsigned} {
				a := s.send(t, d)
				if err := refused(http.StatusUnauthorized, `"about:blank"`)(a); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if strings.Contains(string(a.body), id) {
					t.Fatalf("%s: the problem quotes the request: %q", name, a.body)
				}
			}
			if n, events := s.store.Len(), len(s.ledger.snapshot()); n != 0 || events != 0 {
				t.Fatalf("after the forgeries: %d entries stored, %d events in the ledger; want none", n, events)
			}
			if a := s.send(t, p.deliver(testSecrets, id, 1)); processed(a) != nil {
				t.Fatalf("the genuine delivery: %d %q (replayed %t), want processed", a.status, a.body, a.replayed())
			}
			if n := s.ledger.times(p.event(id)); n != 1 || s.store.Len() != 1 {
				t.Fatalf("the genuine delivery: %d effects, %d entries stored; want 1 and 1", n, s.store.Len())
			}
		})
	}
}

// TestMissingID: a signed delivery without the event's id gets idem's 400
// ErrMissingKey, and nothing is done or stored.
func TestMissingID(t *testing.T) {
	for _, p := range providers {
		t.Run(p.name, func(t *testing.T) {
			s := serve(t, nil)
			a := s.send(t, p.noID(testSecrets))
			if err := refused(http.StatusBadRequest, "https://pkg.go.dev/github.com/idemkit/idem#ErrMissingKey")(a); err != nil {
				t.Fatal(err)
			}
			if n, events := s.store.Len(), len(s.ledger.snapshot()); n != 0 || events != 0 {
				t.Fatalf("%d entries stored, %d events in the ledger; want none", n, events)
			}
		})
	}
}

// TestScopeIsTheProvider: a redelivery that carries an Authorization header
// (the first did not) is still the same event: the scope is the provider,
// not the header.
func TestScopeIsTheProvider(t *testing.T) {
	for _, p := range providers {
		t.Run(p.name, func(t *testing.T) {
			s := serve(t, nil)
			id := p.name + "-evt-3"
			first := s.send(t, p.deliver(testSecrets, id, 1))
			again := p.deliver(testSecrets, id, 2)
			again.header = append(again.header, [2]string{"Authorization", "Basic d2ViaG9vazpzZWNyZXQ="})
			if err := replayOf(first)(s.send(t, again)); err != nil {
				t.Fatalf("a redelivery with an Authorization header: %v", err)
			}
			if n := s.ledger.times(p.event(id)); n != 1 {
				t.Fatalf("%d effects, want 1", n)
			}
		})
	}
}

// TestAlipayStatusChanges: each status change of a trade is processed once;
// its redeliveries are replayed.
func TestAlipayStatusChanges(t *testing.T) {
	s := serve(t, nil)
	const trade = "2025060122009"
	for i, status := range []string{"TRADE_SUCCESS", "TRADE_SUCCESS", "TRADE_FINISHED", "TRADE_SUCCESS", "TRADE_FINISHED"} {
		a := s.send(t, alipayDelivery(testSecrets.alipay, tradeForm(trade, status, notified(i))))
		if a.status != http.StatusOK || string(a.body) != "success" || a.replayed() != (i >= 1 && i != 2) {
			t.Fatalf("notification %d (%s): %d %q replayed %t", i, status, a.status, a.body, a.replayed())
		}
	}
	got := s.ledger.snapshot()
	if len(got) != 2 || got[0].times != 1 || got[1].times != 1 ||
		got[0].effect != "trade "+trade+" paid: 12.50 CNY" || got[1].effect != "trade "+trade+" finished: no more refunds" {
		t.Fatalf("ledger %+v, want the payment and the finish, once each", got)
	}
}

// TestStripeTolerance: a Stripe-Signature whose timestamp is more than the
// tolerance (5 minutes) away from the server's clock is refused, whatever
// its signature.
func TestStripeTolerance(t *testing.T) {
	s := serve(t, nil)
	for i, c := range []struct {
		offset time.Duration
		status int
	}{
		{-4 * time.Minute, http.StatusOK},
		{4 * time.Minute, http.StatusOK},
		{-6 * time.Minute, http.StatusUnauthorized}, // a replay of an old delivery
		{6 * time.Minute, http.StatusUnauthorized},
	} {
		d := stripeDelivery(testSecrets.stripe, time.Now().Add(c.offset), stripeEventJSON(fmt.Sprintf("evt_tol%d", i), 100, 1))
		if a := s.send(t, d); a.status != c.status {
			t.Errorf("signed %v from the server's clock: %d %q, want %d", c.offset, a.status, a.body, c.status)
		}
	}
}

// TestVerifiers: each provider's signature scheme, against a known value
// where the provider publishes one, and the malformed headers.
func TestVerifiers(t *testing.T) {
	// GitHub's documented test vector.
	if got := githubSignature([]byte("It's a Secret to Everybody"), []byte("Hello, World!")); got != "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17" {
		t.Errorf("githubSignature: %s", got)
	}
	body := []byte(`{"id":"evt_1"}`)
	req := func(header ...string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		for i := 0; i+1 < len(header); i += 2 {
			r.Header.Add(header[i], header[i+1])
		}
		return r
	}
	stripe := stripeVerifier(testSecrets.stripe)
	now := time.Now().Unix()
	ts := fmt.Sprint(now)
	good := stripeSignature(testSecrets.stripe, now, body)
	old := stripeSignature([]byte("whsec_old"), now, body)
	gh := githubVerifier(testSecrets.github)
	for _, c := range []struct {
		name string
		v    verifier
		r    *http.Request
		ok   bool
	}{
		{"stripe", stripe, req("Stripe-Signature", "t="+ts+",v1="+good), true},
		{"stripe, secret rolled: two v1", stripe, req("Stripe-Signature", "t="+ts+",v1="+old+",v1="+good+",v0=abc"), true},
		{"stripe, old secret only", stripe, req("Stripe-Signature", "t="+ts+",v1="+old), false},
		{"stripe, v0 only", stripe, req("Stripe-Signature", "t="+ts+",v0="+good), false},
		{"stripe, no timestamp", stripe, req("Stripe-Signature", "v1="+good), false},
		{"stripe, bad timestamp", stripe, req("Stripe-Signature", "t=x,v1="+good), false},
		{"stripe, two headers", stripe, req("Stripe-Signature", "t="+ts+",v1="+good, "Stripe-Signature", "t="+ts+",v1="+good), false},
		{"stripe, none", stripe, req(), false},
		{"github", gh, req("X-Hub-Signature-256", githubSignature(testSecrets.github, body)), true},
		{"github, sha1", gh, req("X-Hub-Signature-256", "sha1="+strings.TrimPrefix(githubSignature(testSecrets.github, body), "sha256=")), false},
		{"github, not hex", gh, req("X-Hub-Signature-256", "sha256=zz"), false},
		{"github, none", gh, req(), false},
	} {
		if err := c.v(c.r, body); (err == nil) != c.ok {
			t.Errorf("%s: %v, want ok %t", c.name, err, c.ok)
		}
	}

	alipay := alipayVerifier(testSecrets.alipay)
	form := tradeForm("2025", "TRADE_SUCCESS", t0)
	signed := alipayDelivery(testSecrets.alipay, form)
	r := req("Content-Type", "application/x-www-form-urlencoded")
	if err := alipay(r, []byte(signed.body)); err != nil {
		t.Errorf("alipay: %v", err)
	}
	changed, _ := url.ParseQuery(signed.body)
	changed.Set("total_amount", "0.01")
	twice, _ := url.ParseQuery(signed.body)
	twice.Add("trade_status", "TRADE_CLOSED")
	rsa, _ := url.ParseQuery(signed.body)
	rsa.Set("sign_type", "RSA2")
	for name, body := range map[string]string{"amount changed": changed.Encode(), "field twice": twice.Encode(), "sign_type RSA2": rsa.Encode()} {
		if err := alipay(r, []byte(body)); err == nil {
			t.Errorf("alipay, %s: verified", name)
		}
	}
	if err := alipay(req("Content-Type", "application/json"), []byte(signed.body)); err == nil {
		t.Error("alipay, not a form: verified")
	}
}

// TestBodyTooLarge: the verifier reads at most maxBody bytes.
func TestBodyTooLarge(t *testing.T) {
	s := serve(t, nil)
	big := strings.Repeat("x", maxBody+1)
	a := s.send(t, githubDelivery(testSecrets.github, "guid-big", big))
	if a.status != http.StatusRequestEntityTooLarge || s.store.Len() != 0 {
		t.Fatalf("%d %q, %d entries stored; want 413, none", a.status, a.body, s.store.Len())
	}
}

// TestSecretsRequired: without -demo, the receivers do not start unless
// each provider's secret is set.
func TestSecretsRequired(t *testing.T) {
	t.Setenv("STRIPE_WEBHOOK_SECRET", "whsec_test")
	t.Setenv("ALIPAY_SIGN_KEY", "")
	t.Setenv("GITHUB_WEBHOOK_SECRET", "github-test-secret")
	if err := run("127.0.0.1:0", "", false, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "$ALIPAY_SIGN_KEY") {
		t.Fatalf("run without $ALIPAY_SIGN_KEY: %v, want an error naming it", err)
	}
}
