// Command webhooks receives the callbacks of two payment providers and a
// code host, each protected by idem, so that an event delivered any number
// of times is processed once.
//
//	go run ./examples/webhooks -demo     # deliver signed events, redeliveries, a forgery; print the ledger; exit
//	go run ./examples/webhooks           # serve on localhost:8080 (-addr), memory store
//	go run ./examples/webhooks -redis localhost:6379
//
// Three receivers, each on its own route with its own idem.Middleware,
// keyed by the id the provider gives the event (idem.WithKey) instead of
// an Idempotency-Key header, which providers do not send:
//
//	POST /stripe   a Stripe event, JSON; Stripe-Signature: t=<unix>,v1=<HMAC-SHA256 of "<t>.<body>">
//	               key: KeyFromJSON("id"), the event's id (evt_...)
//	POST /alipay   an Alipay trade notification, a form signed in its sign field
//	               key: KeyFromForm("trade_no", "trade_status"), one processing per status change
//	POST /github   a GitHub delivery, JSON; X-Hub-Signature-256: sha256=<HMAC-SHA256 of the body>
//	               key: KeyFromHeader("X-GitHub-Delivery"), the GUID a redelivery keeps
//
// Each handler performs its side effect (a payment captured, a trade paid,
// an issue opened) in an in-memory ledger that counts how often each event
// was processed. With -demo the command serves on a free port and plays
// the providers against it: each event is delivered several times, some
// deliveries at once, some later with a body that differs in a delivery
// field (Stripe's pending_webhooks, Alipay's notify_time) and is signed
// anew; one delivery is forged, one carries no id. It prints the exchanges
// and the ledger, and exits with status 1 unless every event was processed
// exactly once. The secrets come from $STRIPE_WEBHOOK_SECRET,
// $ALIPAY_SIGN_KEY and $GITHUB_WEBHOOK_SECRET (demo values when unset). A
// delivery by hand, to the server without -demo:
//
//	body='{"action":"opened","issue":{"number":1,"title":"Hello"},"repository":{"full_name":"acme/shop"}}'
//	sig=$(printf %s "$body" | openssl dgst -sha256 -hmac "$GITHUB_WEBHOOK_SECRET" | sed 's/.* //')
//	curl -i localhost:8080/github -H 'X-GitHub-Event: issues' -H 'X-GitHub-Delivery: 72d3162e-cc78-11e3-81ab-4c9367dc0958' \
//	    -H "X-Hub-Signature-256: sha256=$sig" -H 'Content-Type: application/json' -d "$body"   # twice: replayed
//
// # Signature first, then idem
//
// Each receiver verifies the provider's signature in a middleware outside
// idem's (see verified). idem takes an event's key as soon as it sees a
// request for it, and keeps the answer to it for the TTL: a forged
// delivery that reached idem first would run the handler with the forger's
// data, or have its refusal stored as the answer every genuine delivery
// of that event then gets. Verified first, a forgery gets 401 and leaves
// no trace in the store.
//
// # No request comparison
//
// With WithKey, idem compares no fingerprint of the request (unless
// WithFingerprint says otherwise): a provider redelivers an event with a
// new signature, a new timestamp, or a delivery counter in the body, and a
// comparison would turn that redelivery into a 422, which the provider
// would retry until it gives up. The signature already proves the body is
// the provider's; the id says which event it is.
//
// # Scope
//
// idem scopes its records by the Authorization header by default, which
// webhooks do not send: every delivery would share the empty scope, and
// the route alone would keep providers apart. Each receiver sets WithScope
// to the provider's name instead. The principal of a webhook is the
// provider, proven by its signature, not by any Authorization header; with
// the default, a delivery that does carry one (basic-auth credentials
// configured in the webhook URL and rotated between two retries of an
// event, a proxy adding one, someone resending a captured Stripe delivery
// within its 5 minutes with a header added) would land in a scope of its
// own and be processed again. The constant also keeps providers apart when several share one
// route pattern (POST /webhooks/{provider}).
//
// # What idem does not do here
//
// The TTL of each receiver outlasts its provider's redeliveries (Stripe
// retries for up to 3 days, Alipay for about 25 hours, and GitHub
// redelivers, on request, deliveries up to 3 days old): a redelivery after
// the TTL would be processed again. GitHub signs the body only, not
// X-GitHub-Delivery, and without a timestamp: a captured delivery resent
// with another delivery id passes the signature and is a new key (TLS
// keeps deliveries from being captured; a handler that must never repeat
// an effect also guards it with the payload's own identity, such as a
// state transition). The ledger is in memory; an effect in a database is
// made exactly once with pgstore's fence, in the effect's own transaction
// (see examples/postgres).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/memstore"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/redis/go-redis/v9"
)

// options is what the command line sets.
type options struct {
	addr    string // listen address
	redis   string // Redis address; "": the memory store
	demo    bool   // serve on a free port, play the providers, exit
	secrets secrets
}

func main() {
	log.SetFlags(0)
	var o options
	flag.StringVar(&o.addr, "addr", "localhost:8080", "listen address")
	flag.StringVar(&o.redis, "redis", "", "Redis address (host:port); default: the in-memory store")
	flag.BoolVar(&o.demo, "demo", false, "serve on a free port, deliver signed events, redeliveries and a forgery to it, print the ledger, and exit")
	flag.Parse()
	var unset []string
	o.secrets, unset = secretsFromEnv()
	if len(unset) > 0 && !o.demo {
		log.Printf("using the demo secrets for %s: set them for real deliveries", strings.Join(unset, ", "))
	}
	if err := run(o, os.Stdout, os.Stderr); err != nil {
		log.Fatal(err)
	}
}

// secrets are the keys the providers sign with.
type secrets struct {
	stripe, alipay, github []byte
}

// secretsFromEnv reads the secrets from the environment; each one unset
// gets a demo value, and its variable's name is returned in unset.
func secretsFromEnv() (s secrets, unset []string) {
	get := func(name, demo string) []byte {
		if v := os.Getenv(name); v != "" {
			return []byte(v)
		}
		unset = append(unset, "$"+name)
		return []byte(demo)
	}
	s.stripe = get("STRIPE_WEBHOOK_SECRET", "whsec_demo")
	s.alipay = get("ALIPAY_SIGN_KEY", "alipay-demo-key")
	s.github = get("GITHUB_WEBHOOK_SECRET", "github-demo-secret")
	return s, unset
}

// run serves the receivers until SIGINT or SIGTERM; with o.demo, on a free
// loopback port while the providers are played against it (transcript and
// ledger to out). The middlewares' decisions and the refused deliveries
// are logged to logw. It stops in the order a deploy needs: the server (no
// new delivery; the handlers return), then each middleware (their records
// are stored), then the store.
func run(o options, out, logw io.Writer) error {
	c := config{secrets: o.secrets, tolerance: 5 * time.Minute}
	g := new(gate)
	if o.demo {
		c.hold = g.hold // the demo's handlers are slow while a burst arrives
	}
	var store storage.Store
	if o.redis == "" {
		ms := memstore.New()
		defer ms.Close() // 3. the store, last
		store = ms
	} else {
		rdb := redis.NewClient(redisstore.ClientOptions(o.redis))
		defer rdb.Close()
		store = redisstore.New(rdb)
	}
	a, err := newApp(store, c, logw)
	if err != nil {
		return err
	}
	addr := o.addr
	if o.demo {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: a, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	var failed error
	if o.demo {
		failed = play(out, "http://"+ln.Addr().String(), o.secrets, a.ledger, g)
	} else {
		log.Printf("listening on http://%s: POST /stripe, POST /alipay, POST /github, signed (see -demo)", ln.Addr())
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		<-ctx.Done()
		stop()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := []error{failed, srv.Shutdown(ctx)} // 1. the server
	for _, m := range a.middlewares {
		errs = append(errs, m.Shutdown(ctx)) // 2. each middleware
	}
	return errors.Join(errs...)
}

// config is what the receivers need besides their store.
type config struct {
	secrets secrets
	// tolerance bounds how far the timestamp of a Stripe-Signature may be
	// from now (Stripe's libraries use 5 minutes).
	tolerance time.Duration
	// now is the clock the tolerance is checked against; nil: time.Now.
	now func() time.Time
	// hold, when not nil, is called by each handler before its effect, once
	// idem holds the event's key: the demo and the tests keep a delivery in
	// flight with it while its duplicates arrive.
	hold func(*http.Request)
}

// app is the three receivers on one mux.
type app struct {
	http.Handler
	middlewares []*idem.Middleware // one per receiver, shut down after the server
	ledger      *ledger
	hold        func(*http.Request)
}

// receiver is one provider's endpoint.
type receiver struct {
	provider string         // the route is POST /provider, the scope the name
	key      idem.KeySource // where the provider's delivery carries the event's id
	ttl      time.Duration  // longer than the provider redelivers
	verify   verifier
	handle   http.HandlerFunc
}

// newApp builds the receivers on store. logw gets the middlewares'
// decisions and the refused deliveries.
func newApp(store storage.Store, c config, logw io.Writer) (*app, error) {
	if c.now == nil {
		c.now = time.Now
	}
	a := &app{ledger: newLedger(), hold: c.hold}
	logger := log.New(logw, "", 0)
	mux := http.NewServeMux()
	for _, rc := range []receiver{
		// Stripe retries an event for up to 3 days, each time with the
		// same id, re-signed.
		{"stripe", idem.KeyFromJSON("id"), 4 * 24 * time.Hour,
			stripeVerifier(c.secrets.stripe, c.tolerance, c.now), a.stripe},
		// The key is the trade's status change, not notify_id alone nor
		// trade_no alone. A trade notifies once per change of status
		// (TRADE_SUCCESS, then TRADE_FINISHED, or TRADE_CLOSED after a
		// full refund), and each change must be processed: keyed by
		// trade_no, the later ones would get the first one's "success"
		// replayed and never run. notify_id names one notification (kept
		// by its redeliveries, for about 25 hours, and spent once it is
		// answered "success"), not the fact it reports: should the same
		// status change come in another notification, it would be
		// processed again. trade_no:trade_status is the fact itself: this
		// trade reached this status, which happens once.
		{"alipay", idem.KeyFromForm("trade_no", "trade_status"), 2 * 24 * time.Hour,
			alipayVerifier(c.secrets.alipay), a.alipay},
		// X-GitHub-Delivery names the event: a redelivery (by hand or
		// through the API, up to 3 days later) keeps it.
		{"github", idem.KeyFromHeader("X-GitHub-Delivery"), 4 * 24 * time.Hour,
			githubVerifier(c.secrets.github), a.github},
	} {
		m, err := idem.New(store,
			idem.WithKey(rc.key),
			idem.WithScope(providerScope(rc.provider)),
			idem.WithTTL(rc.ttl),
			idem.WithMaxRequestBody(maxBody),
			idem.WithObserver(func(ev idem.Event) { // logs each decision
				logger.Printf("idem: %s %s -> %s %d (%v)", ev.Method, ev.Route, ev.Outcome, ev.Status, ev.Duration.Round(time.Microsecond))
			}),
		)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", rc.provider, err)
		}
		a.middlewares = append(a.middlewares, m)
		mux.Handle("POST /"+rc.provider, verified(rc.provider, rc.verify, logger)(nethttp.Middleware(m)(rc.handle)))
	}
	a.Handler = mux
	return a, nil
}

// providerScope is the scope of a provider's deliveries: the provider
// itself, whatever Authorization header a delivery carries (see the
// package comment).
func providerScope(provider string) func(*http.Request) string {
	return func(*http.Request) string { return "webhook:" + provider }
}

// effect records the effect of the event idem runs the handler for, by the
// key idem took, and returns the effect's number in the ledger.
func (a *app) effect(r *http.Request, provider, what string) int {
	if a.hold != nil {
		a.hold(r)
	}
	info, _ := idem.FromContext(r.Context())
	return a.ledger.record(provider+" "+info.Key, what)
}

// stripeEvent is the part of a Stripe event this receiver reads.
type stripeEvent struct {
	ID   string `json:"id"`
	Type string `json:"type"`
	Data struct {
		Object struct {
			ID       string `json:"id"`
			Amount   int64  `json:"amount"`
			Currency string `json:"currency"`
		} `json:"object"`
	} `json:"data"`
}

// stripe processes a Stripe event: a succeeded payment intent is captured.
// The answer is stored and replayed to every later delivery of the event.
func (a *app) stripe(w http.ResponseWriter, r *http.Request) {
	var ev stripeEvent
	if err := json.NewDecoder(r.Body).Decode(&ev); err != nil {
		http.Error(w, "the event is not JSON", http.StatusBadRequest)
		return
	}
	what := "event " + ev.Type + ": nothing to do"
	if ev.Type == "payment_intent.succeeded" {
		o := ev.Data.Object
		what = fmt.Sprintf("payment %s captured: %d.%02d %s", o.ID, o.Amount/100, o.Amount%100, strings.ToUpper(o.Currency))
	}
	n := a.effect(r, "stripe", what)
	writeJSON(w, map[string]any{"received": true, "effect": what, "effect_no": n})
}

// alipay processes an Alipay trade notification and answers "success",
// the only answer that stops Alipay's redeliveries. A failure to process
// it should answer 5xx: idem releases the key, and the redelivery runs
// again; a 4xx would be stored and replayed to every redelivery.
func (a *app) alipay(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		http.Error(w, "fail", http.StatusBadRequest)
		return
	}
	trade, status := r.PostForm.Get("trade_no"), r.PostForm.Get("trade_status")
	var what string
	switch status {
	case "TRADE_SUCCESS":
		what = fmt.Sprintf("trade %s paid: %s CNY", trade, r.PostForm.Get("total_amount"))
	case "TRADE_FINISHED":
		what = fmt.Sprintf("trade %s finished: no more refunds", trade)
	case "TRADE_CLOSED":
		what = fmt.Sprintf("trade %s closed", trade)
	default:
		what = fmt.Sprintf("trade %s %s: nothing to do", trade, status)
	}
	a.effect(r, "alipay", what)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.WriteString(w, "success")
}

// githubPayload is the part of a GitHub payload this receiver reads.
type githubPayload struct {
	Action string `json:"action"`
	Issue  struct {
		Number int    `json:"number"`
		Title  string `json:"title"`
	} `json:"issue"`
	Repository struct {
		FullName string `json:"full_name"`
	} `json:"repository"`
}

// github processes a GitHub delivery: an opened issue is triaged.
func (a *app) github(w http.ResponseWriter, r *http.Request) {
	var p githubPayload
	if err := json.NewDecoder(r.Body).Decode(&p); err != nil {
		http.Error(w, "the payload is not JSON", http.StatusBadRequest)
		return
	}
	event := r.Header.Get("X-GitHub-Event")
	what := "event " + event + ": nothing to do"
	if event == "issues" && p.Action == "opened" {
		what = fmt.Sprintf("issue %s#%d opened: %q triaged", p.Repository.FullName, p.Issue.Number, p.Issue.Title)
	}
	n := a.effect(r, "github", what)
	writeJSON(w, map[string]any{"received": true, "effect": what, "effect_no": n})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

// ledger records the receivers' effects, as a service would in its
// database, and counts them per event: an event processed twice shows.
type ledger struct {
	mu      sync.Mutex
	made    int            // effects made, all events together
	entries []*ledgerEntry // one per event, in order of first processing
	byEvent map[string]*ledgerEntry
}

// ledgerEntry is one event's effect and how often it was made.
type ledgerEntry struct {
	event, effect string
	times         int
}

func newLedger() *ledger { return &ledger{byEvent: make(map[string]*ledgerEntry)} }

// record makes one effect of event and returns its number (from 1, all
// events together): an answer that carries the number of an earlier
// effect is a replay, not a second processing.
func (l *ledger) record(event, effect string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.byEvent[event]
	if !ok {
		e = &ledgerEntry{event: event, effect: effect}
		l.entries = append(l.entries, e)
		l.byEvent[event] = e
	}
	e.times++
	l.made++
	return l.made
}

// times returns how often event was processed.
func (l *ledger) times(event string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.byEvent[event]; ok {
		return e.times
	}
	return 0
}

// snapshot returns a copy of the entries, in order.
func (l *ledger) snapshot() []ledgerEntry {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]ledgerEntry, len(l.entries))
	for i, e := range l.entries {
		out[i] = *e
	}
	return out
}
