package main

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// burst is how many copies of an event the demo delivers at once: the
// first delivery and retries that overlap it.
const burst = 4

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

// player plays the providers against a server and keeps the transcript.
type player struct {
	out    io.Writer
	base   string
	client *http.Client
	gate   *gate
	errs   []error
}

// gate holds the handlers of the demo's bursts, as slow handlers, until
// the burst's other deliveries have been answered, so that the transcript
// shows them turned away (409, in flight) on every run. Its hold is the
// server's config.hold.
type gate struct {
	mu     sync.Mutex
	closed chan struct{} // nil while the gate is open
}

// hold waits while the gate is closed, for at most 3 seconds.
func (g *gate) hold(r *http.Request) {
	g.mu.Lock()
	closed := g.closed
	g.mu.Unlock()
	if closed == nil {
		return
	}
	t := time.NewTimer(3 * time.Second)
	defer t.Stop()
	select {
	case <-closed:
	case <-t.C:
	case <-r.Context().Done():
	}
}

// close closes the gate and returns the function that opens it again.
func (g *gate) close() (open func()) {
	closed := make(chan struct{})
	g.mu.Lock()
	g.closed = closed
	g.mu.Unlock()
	return func() {
		g.mu.Lock()
		g.closed = nil
		g.mu.Unlock()
		close(closed)
	}
}

// play delivers the demo's events to base ("http://host:port") as the
// providers would, signed with s, and writes the exchanges to out, then
// the ledger l of the server. g is the gate whose hold the server's
// handlers call. It returns an error describing every answer that was not
// the promised one and every event not processed exactly once.
//
// The events' ids are made of 8 random hex digits, so that runs can
// follow one another against one Redis.
func play(out io.Writer, base string, s secrets, l *ledger, g *gate) error {
	var rnd [4]byte
	rand.Read(rnd[:])
	run := hex.EncodeToString(rnd[:])
	p := &player{out: out, base: base, client: &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}, gate: g}
	defer p.client.CloseIdleConnections()
	var events []string // the ledger's events, each to be processed once

	// Stripe: an event, its retries racing it, a retry with a body that
	// differs in pending_webhooks; then a forgery of the next event before
	// the genuine one.
	evtA, evtB := "evt_"+run+"A", "evt_"+run+"B"
	first := p.burst("stripe: "+evtA+" is delivered "+fmt.Sprint(burst)+" times at once (the first delivery and retries that overlap it): processed once",
		stripeDelivery(s.stripe, time.Now(), stripeEventJSON(evtA, "pi_"+run+"A", 2000, 1)))
	p.once("stripe: Stripe retries "+evtA+" later, signed anew, pending_webhooks changed: replayed (no request comparison)",
		stripeDelivery(s.stripe, time.Now(), stripeEventJSON(evtA, "pi_"+run+"A", 2000, 2)), replayOf(first))
	p.once("stripe: a forged delivery of "+evtB+" (signed with another secret): refused before idem, no key taken",
		stripeDelivery([]byte("whsec_forged"), time.Now(), stripeEventJSON(evtB, "pi_forged", 9999900, 1)), refused(http.StatusUnauthorized, ""))
	p.once("stripe: the genuine "+evtB+": processed (the forgery left nothing behind)",
		stripeDelivery(s.stripe, time.Now(), stripeEventJSON(evtB, "pi_"+run+"B", 4550, 1)), processed)
	events = append(events, "stripe "+evtA, "stripe "+evtB)

	// Alipay: a trade's payment notified, its retries racing it, a retry
	// 4 minutes later (notify_time changed, signed anew); then the trade's
	// next status change, a new fact.
	trade := "2025" + run
	shanghai := time.FixedZone("CST", 8*60*60)
	paidAt := time.Now().In(shanghai)
	paid := func(notified time.Time) url.Values {
		return url.Values{
			"notify_id": {run + "0000000000000000000001"}, "notify_time": {notified.Format(time.DateTime)},
			"trade_no": {trade}, "out_trade_no": {"order-" + run}, "trade_status": {"TRADE_SUCCESS"}, "total_amount": {"88.88"},
		}
	}
	first = p.burst("alipay: trade "+trade+" paid, notified "+fmt.Sprint(burst)+" times at once: processed once",
		alipayDelivery(s.alipay, paid(paidAt)))
	p.once("alipay: Alipay's retry 4 minutes later, notify_time changed, signed anew: replayed (no request comparison)",
		alipayDelivery(s.alipay, paid(paidAt.Add(4*time.Minute))), replayOf(first))
	finished := url.Values{
		"notify_id": {run + "0000000000000000000002"}, "notify_time": {paidAt.Add(90 * 24 * time.Hour).Format(time.DateTime)},
		"trade_no": {trade}, "out_trade_no": {"order-" + run}, "trade_status": {"TRADE_FINISHED"}, "total_amount": {"88.88"},
	}
	p.once("alipay: the same trade's next status change, TRADE_FINISHED: another key (trade_no:trade_status), processed",
		alipayDelivery(s.alipay, finished), processed)
	events = append(events, "alipay "+trade+":TRADE_SUCCESS", "alipay "+trade+":TRADE_FINISHED")

	// GitHub: a delivery, its copies racing it, a redelivery by hand
	// (same delivery id, same body); then a delivery without its id.
	guid, err := uuid()
	if err != nil {
		return err
	}
	issue := `{"action":"opened","issue":{"number":42,"title":"Checkout charges twice"},"repository":{"full_name":"acme/shop"}}`
	first = p.burst("github: delivery "+guid+" (issue opened) sent "+fmt.Sprint(burst)+" times at once: processed once",
		githubDelivery(s.github, "issues", guid, issue))
	p.once("github: redelivered (same X-GitHub-Delivery, same body): replayed",
		githubDelivery(s.github, "issues", guid, issue), replayOf(first))
	p.once("github: a signed delivery without X-GitHub-Delivery: 400, no key to protect it by",
		githubDelivery(s.github, "issues", "", issue), refused(http.StatusBadRequest, "#ErrMissingKey"))
	events = append(events, "github "+guid)

	p.checkLedger(l, events)
	return errors.Join(p.errs...)
}

// checkLedger prints the ledger and checks that it holds events, each
// processed once, and nothing else.
func (p *player) checkLedger(l *ledger, events []string) {
	fmt.Fprintf(p.out, "\n# the ledger: each event processed once\n")
	entries := l.snapshot()
	for _, e := range entries {
		fmt.Fprintf(p.out, "%d x %s: %s\n", e.times, e.event, e.effect)
	}
	for _, ev := range events {
		if n := l.times(ev); n != 1 {
			p.errs = append(p.errs, fmt.Errorf("ledger: %s processed %d times, want once", ev, n))
		}
	}
	if len(entries) != len(events) {
		p.errs = append(p.errs, fmt.Errorf("ledger: %d events, want %d", len(entries), len(events)))
	}
}

// A check says what is wrong with an answer, or nil.
type check func(answer) error

func processed(a answer) error {
	if a.status/100 != 2 || a.replayed() {
		return fmt.Errorf("got %d (replayed %t), want 2xx processed, not replayed", a.status, a.replayed())
	}
	return nil
}

// replayOf: the answer is first's, replayed.
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

// once sends d, prints the exchange and checks the answer.
func (p *player) once(title string, d delivery, want check) answer {
	a, err := p.send(d)
	if err != nil {
		p.errs = append(p.errs, fmt.Errorf("%s: %w", title, err))
		return a
	}
	p.show(title, d, a)
	if err := want(a); err != nil {
		p.errs = append(p.errs, fmt.Errorf("%s: %w", title, err))
	}
	return a
}

// burst sends burst copies of d at once, holding the handler (see gate)
// until all but one were answered, prints the answer of the one that was
// processed and a count of the others, and checks that exactly one was
// processed and each other got 409 (the first was in flight) or its
// replay. It returns the processed answer.
func (p *player) burst(title string, d delivery) answer {
	type result struct {
		a   answer
		err error
	}
	results := make(chan result, burst)
	open := p.gate.close()
	for range burst {
		go func() {
			a, err := p.send(d)
			results <- result{a, err}
		}()
	}
	var answers []answer
	var errs []error
	for i := range burst {
		if i == burst-1 {
			open() // the others were answered: let the first finish
		}
		r := <-results
		answers, errs = append(answers, r.a), append(errs, r.err)
	}
	if err := errors.Join(errs...); err != nil {
		p.errs = append(p.errs, fmt.Errorf("%s: %w", title, err))
		return answer{}
	}
	var ran []answer
	replays, conflicts := 0, 0
	for _, a := range answers {
		switch {
		case a.replayed():
			replays++
		case a.status == http.StatusConflict:
			conflicts++
		default:
			ran = append(ran, a)
		}
	}
	if len(ran) != 1 {
		p.errs = append(p.errs, fmt.Errorf("%s: %d deliveries processed, want 1", title, len(ran)))
		return answer{}
	}
	first := ran[0]
	p.show(title, d, first)
	fmt.Fprintf(p.out, "  the %d others: %d x 409 (in flight; the provider retries them later)", burst-1, conflicts)
	if replays > 0 {
		fmt.Fprintf(p.out, ", %d x %d with Idempotent-Replayed: true and this body", replays, first.status)
	}
	fmt.Fprintln(p.out)
	if err := processed(first); err != nil {
		p.errs = append(p.errs, fmt.Errorf("%s: %w", title, err))
	}
	for _, a := range answers {
		if a.replayed() {
			if err := replayOf(first)(a); err != nil {
				p.errs = append(p.errs, fmt.Errorf("%s: %w", title, err))
			}
		}
	}
	return first
}

func (p *player) send(d delivery) (answer, error) {
	req, err := http.NewRequest(http.MethodPost, p.base+d.path, strings.NewReader(d.body))
	if err != nil {
		return answer{}, err
	}
	for _, h := range d.header {
		req.Header.Add(h[0], h[1])
	}
	res, err := p.client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return answer{res.StatusCode, res.Header, b}, err
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

// stripeEventJSON is a payment_intent.succeeded event; pending counts the
// webhooks still to deliver it, which changes between deliveries.
func stripeEventJSON(id, intent string, amount int64, pending int) string {
	return fmt.Sprintf(`{"id":%q,"object":"event","type":"payment_intent.succeeded","pending_webhooks":%d,`+
		`"data":{"object":{"id":%q,"object":"payment_intent","amount":%d,"currency":"eur"}}}`, id, pending, intent, amount)
}

// stripeDelivery is body, signed with secret at t.
func stripeDelivery(secret []byte, t time.Time, body string) delivery {
	sig := fmt.Sprintf("t=%d,v1=%s", t.Unix(), stripeSignature(secret, t.Unix(), []byte(body)))
	return delivery{"/stripe", [][2]string{{"Content-Type", "application/json"}, {"Stripe-Signature", sig}}, body}
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

// githubDelivery is body as the event, with the delivery id guid (none
// when ""), signed with secret.
func githubDelivery(secret []byte, event, guid, body string) delivery {
	h := [][2]string{{"Content-Type", "application/json"}, {"X-GitHub-Event", event}}
	if guid != "" {
		h = append(h, [2]string{"X-GitHub-Delivery", guid})
	}
	h = append(h, [2]string{"X-Hub-Signature-256", githubSignature(secret, []byte(body))})
	return delivery{"/github", h, body}
}

// uuid returns a random (version 4) UUID, as GitHub's delivery ids are.
func uuid() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("delivery id: %w", err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16]), nil
}
