package main

// This file is the -demo: it plays Stripe, Alipay and GitHub against the
// receivers. A service copied from this example drops it, and its calls in
// run.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/examples/democlient"
	"github.com/idemkit/idem/storage"
)

// burst is how many copies of an event the demo delivers at once: the
// first delivery and retries that overlap it.
const burst = 4

// demoSecrets are what the demo signs with, and its receivers verify with.
var demoSecrets = secrets{stripe: []byte("whsec_demo"), alipay: []byte("alipay-demo-key"), github: []byte("github-demo-secret")}

// burstStore is the demo's store. During a burst, it holds the record of
// the delivery being processed (Complete) until each other copy found the
// event in flight (Acquire), or for 5 seconds, as if the handler were
// slow: the copies get 409 on every run.
type burstStore struct {
	storage.Store
	inFlight atomic.Pointer[chan struct{}] // during a burst: a value per copy that found the event in flight
}

func (s *burstStore) Acquire(ctx context.Context, key, owner, fingerprint string, lease time.Duration) (storage.Result, error) {
	res, err := s.Store.Acquire(ctx, key, owner, fingerprint, lease)
	if ch := s.inFlight.Load(); ch != nil && err == nil && res.State == storage.InFlight {
		*ch <- struct{}{} // at most burst-1 of them: never blocks
	}
	return res, err
}

func (s *burstStore) Complete(ctx context.Context, key, owner string, record []byte, ttl time.Duration) error {
	if ch := s.inFlight.Load(); ch != nil {
		timeout := time.After(5 * time.Second)
	wait:
		for range burst - 1 {
			select {
			case <-*ch:
			case <-timeout:
				break wait
			}
		}
	}
	return s.Store.Complete(ctx, key, owner, record, ttl)
}

// play delivers the demo's events to base ("http://host:port") as the
// providers would, each several times, signed with demoSecrets, through
// store, then prints the ledger l. It writes the exchanges to out and
// returns an error for each answer that is not the promised one and each
// event not processed exactly once. Its ids are new on each run, so that
// runs can follow one another on one Redis.
func play(out io.Writer, base string, l *ledger, store *burstStore) error {
	p := &player{out: out, base: base, store: store}
	s, run, now := demoSecrets, democlient.RunID(), time.Now()

	evtA, evtB := "evt_"+run+"A", "evt_"+run+"B"
	first := p.burst("stripe: "+evtA+", delivered 4 times at once (retries overlapping the first): processed once",
		stripeDelivery(s.stripe, now, stripeEventJSON(evtA, 2000, 1)))
	p.once("stripe: "+evtA+" retried later, signed anew, pending_webhooks changed: replayed (no request comparison)",
		stripeDelivery(s.stripe, now.Add(time.Minute), stripeEventJSON(evtA, 2000, 2)), replayOf(first))
	p.once("stripe: a forgery of "+evtB+" (another secret): 401 before idem, no key taken",
		stripeDelivery([]byte("whsec_forged"), now, stripeEventJSON(evtB, 9999900, 1)), refused(http.StatusUnauthorized, ""))
	p.once("stripe: the genuine "+evtB+": processed (the forgery left nothing behind)",
		stripeDelivery(s.stripe, now, stripeEventJSON(evtB, 4550, 1)), processed)

	trade := "2025" + run
	first = p.burst("alipay: trade "+trade+" paid, notified 4 times at once: processed once",
		alipayDelivery(s.alipay, tradeForm(trade, "TRADE_SUCCESS", now)))
	p.once("alipay: retried 4 minutes later, notify_time changed, signed anew: replayed (no request comparison)",
		alipayDelivery(s.alipay, tradeForm(trade, "TRADE_SUCCESS", now.Add(4*time.Minute))), replayOf(first))
	p.once("alipay: the trade's next status change, TRADE_FINISHED: another key (trade_no:trade_status), processed",
		alipayDelivery(s.alipay, tradeForm(trade, "TRADE_FINISHED", now.Add(90*24*time.Hour))), processed)

	guid := run + "-cc78-11e3-81ab-4c9367dc0958" // a delivery's GUID
	issue := `{"action":"opened","issue":{"number":42,"title":"Checkout charges twice"},"repository":{"full_name":"acme/shop"}}`
	first = p.burst("github: delivery "+guid+" (issue opened), sent 4 times at once: processed once",
		githubDelivery(s.github, guid, issue))
	p.once("github: redelivered (same X-GitHub-Delivery, same body): replayed", githubDelivery(s.github, guid, issue), replayOf(first))
	p.once("github: a signed delivery without X-GitHub-Delivery: 400, no key to protect it by",
		githubDelivery(s.github, "", issue), refused(http.StatusBadRequest, "#ErrMissingKey"))

	fmt.Fprintf(out, "\n# the ledger: each event processed once\n")
	entries := l.snapshot()
	for _, e := range entries {
		fmt.Fprintf(out, "%d x %s: %s\n", e.times, e.event, e.effect)
	}
	events := []string{"stripe " + evtA, "stripe " + evtB, "alipay " + trade + ":TRADE_SUCCESS", "alipay " + trade + ":TRADE_FINISHED", "github " + guid}
	for _, ev := range events {
		if n := l.times(ev); n != 1 {
			p.errs = append(p.errs, fmt.Errorf("ledger: %s processed %d times, want once", ev, n))
		}
	}
	if len(entries) != len(events) {
		p.errs = append(p.errs, fmt.Errorf("ledger: %d events, want %d", len(entries), len(events)))
	}
	return errors.Join(p.errs...)
}

// player sends the demo's deliveries and keeps what went wrong.
type player struct {
	out   io.Writer
	base  string
	store *burstStore
	errs  []error
}

// once sends d, prints the exchange and checks the answer with want.
func (p *player) once(title string, d delivery, want check) answer {
	a, err := send(p.base, d)
	if err == nil {
		p.show(title, d, a)
		err = want(a)
	}
	if err != nil {
		p.errs = append(p.errs, fmt.Errorf("%s: %w", title, err))
	}
	return a
}

// burst sends burst copies of d at once, the processed one held in flight
// (burstStore), prints its answer and checks that the others got 409. It
// returns the processed answer.
func (p *player) burst(title string, d delivery) answer {
	ch := make(chan struct{}, burst)
	p.store.inFlight.Store(&ch)
	defer p.store.inFlight.Store(nil)
	answers, errs := make([]answer, burst), make([]error, burst)
	var wg sync.WaitGroup
	for i := range burst {
		wg.Go(func() { answers[i], errs[i] = send(p.base, d) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		p.errs = append(p.errs, fmt.Errorf("%s: %w", title, err))
		return answer{}
	}
	var first answer
	conflicts := 0
	for _, a := range answers {
		if a.status == http.StatusConflict {
			conflicts++
		} else {
			first = a
		}
	}
	p.show(title, d, first)
	fmt.Fprintf(p.out, "  the %d others: %d x 409 (in flight; the provider retries them later)\n", burst-1, conflicts)
	if conflicts != burst-1 {
		p.errs = append(p.errs, fmt.Errorf("%s: %d x 409, want %d", title, conflicts, burst-1))
	}
	if err := processed(first); err != nil {
		p.errs = append(p.errs, fmt.Errorf("%s: %w", title, err))
	}
	return first
}

// show prints d as a curl command and a, curl -i style but shorter.
func (p *player) show(title string, d delivery, a answer) {
	fmt.Fprintf(p.out, "\n# %s\n$ curl -X POST '%s%s'", title, p.base, d.path)
	for _, h := range d.header {
		fmt.Fprintf(p.out, " -H '%s: %s'", h[0], h[1])
	}
	fmt.Fprintf(p.out, " -d '%s'\nHTTP %d", d.body, a.status)
	for _, h := range []string{"Idempotent-Replayed", "Content-Type"} {
		if v := a.header.Get(h); v != "" {
			fmt.Fprintf(p.out, "  %s: %s", h, v)
		}
	}
	fmt.Fprintf(p.out, "\n%s\n", strings.TrimRight(string(a.body), "\n"))
}

// delivery is one HTTP request a provider sends.
type delivery struct {
	path   string
	header [][2]string // in the order the transcript shows them
	body   string
}

// answer is what a delivery got back.
type answer struct {
	status int
	header http.Header
	body   []byte
}

func (a answer) replayed() bool { return a.header.Get("Idempotent-Replayed") == "true" }

var client = &http.Client{Timeout: 10 * time.Second}

// send sends d to base.
func send(base string, d delivery) (answer, error) {
	req, err := http.NewRequest(http.MethodPost, base+d.path, strings.NewReader(d.body))
	if err != nil {
		return answer{}, err
	}
	for _, h := range d.header {
		req.Header.Add(h[0], h[1])
	}
	res, err := client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return answer{res.StatusCode, res.Header, b}, err
}

// A check says what is wrong with an answer, or nil.
type check func(answer) error

// processed: a 2xx, not replayed.
func processed(a answer) error {
	if a.status/100 != 2 || a.replayed() {
		return fmt.Errorf("got %d (replayed %t), want 2xx processed, not replayed", a.status, a.replayed())
	}
	return nil
}

// replayOf: first's answer, replayed.
func replayOf(first answer) check {
	return func(a answer) error {
		if a.status != first.status || !a.replayed() || !bytes.Equal(a.body, first.body) {
			return fmt.Errorf("got %d (replayed %t) %q, want %d %q replayed", a.status, a.replayed(), a.body, first.status, first.body)
		}
		return nil
	}
}

// refused: a problem with status, whose body contains typ.
func refused(status int, typ string) check {
	return func(a answer) error {
		if a.status != status || a.header.Get("Content-Type") != "application/problem+json" || !bytes.Contains(a.body, []byte(typ)) {
			return fmt.Errorf("got %d %s %q, want %d application/problem+json %s", a.status, a.header.Get("Content-Type"), a.body, status, typ)
		}
		return nil
	}
}

// stripeEventJSON is a payment_intent.succeeded event; pending counts the
// webhooks still to deliver it, which changes between deliveries.
func stripeEventJSON(id string, amount int64, pending int) string {
	return fmt.Sprintf(`{"id":%q,"object":"event","type":"payment_intent.succeeded","pending_webhooks":%d,`+
		`"data":{"object":{"id":"pi_%s","object":"payment_intent","amount":%d,"currency":"eur"}}}`, id, pending, strings.TrimPrefix(id, "evt_"), amount)
}

// stripeDelivery is body, signed with secret at t.
func stripeDelivery(secret []byte, t time.Time, body string) delivery {
	sig := fmt.Sprintf("t=%d,v1=%s", t.Unix(), stripeSignature(secret, t.Unix(), []byte(body)))
	return delivery{"/stripe", [][2]string{{"Content-Type", "application/json"}, {"Stripe-Signature", sig}}, body}
}

// tradeForm is a notification of trade's status, sent at notified.
func tradeForm(trade, status string, notified time.Time) url.Values {
	return url.Values{"notify_id": {trade + "-" + status}, "notify_time": {notified.In(time.FixedZone("CST", 8*3600)).Format(time.DateTime)},
		"trade_no": {trade}, "trade_status": {status}, "total_amount": {"12.50"}}
}

// alipayDelivery is form, signed with key.
func alipayDelivery(key []byte, form url.Values) delivery {
	signed := url.Values{"sign_type": {alipaySignType}}
	for k, v := range form {
		signed[k] = v
	}
	signed.Set("sign", alipaySignature(key, signed))
	return delivery{"/alipay", [][2]string{{"Content-Type", "application/x-www-form-urlencoded; charset=utf-8"}}, signed.Encode()}
}

// githubDelivery is an issues event, body, with the delivery id guid (none
// when ""), signed with secret.
func githubDelivery(secret []byte, guid, body string) delivery {
	h := [][2]string{{"Content-Type", "application/json"}, {"X-GitHub-Event", "issues"}}
	if guid != "" {
		h = append(h, [2]string{"X-GitHub-Delivery", guid})
	}
	h = append(h, [2]string{"X-Hub-Signature-256", githubSignature(secret, []byte(body))})
	return delivery{"/github", h, body}
}

// snapshot returns a copy of the ledger's entries, in order.
func (l *ledger) snapshot() []ledgerEntry {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]ledgerEntry, len(l.entries))
	for i, e := range l.entries {
		out[i] = *e
	}
	return out
}

// times returns how often event was processed.
func (l *ledger) times(event string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.byEvent[event]; e != nil {
		return e.times
	}
	return 0
}
