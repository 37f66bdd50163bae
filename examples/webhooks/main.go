// Command webhooks receives the callbacks of two payment providers and a
// code host, each protected by idem, so that an event delivered any number
// of times is processed once.
//
//	go run ./examples/webhooks -demo     # deliver signed events, redeliveries, a forgery; print the ledger; exit
//	go run ./examples/webhooks           # serve on localhost:8080 (-addr), memory store
//	go run ./examples/webhooks -redis localhost:6379
//
// Providers send no Idempotency-Key: each route has its own
// idem.Middleware, keyed by the id the provider gives the event (WithKey):
//
//	POST /stripe   a JSON event, Stripe-Signature        KeyFromJSON("id"): evt_...
//	POST /alipay   a trade notification, a signed form   KeyFromForm("trade_no", "trade_status"): one per status change
//	POST /github   a JSON delivery, X-Hub-Signature-256  KeyFromHeader("X-GitHub-Delivery"): kept by a redelivery
//
// The signature is verified before idem (signature.go), so a forgery gets
// 401 and takes no event's key. Any delivery of a known id gets the stored
// answer, however it was re-signed or what delivery field changed: with
// WithKey, idem compares no request fingerprint. The scope is the provider,
// not the Authorization header, and the TTL outlasts the provider's
// redeliveries. Each handler records its effect in an in-memory ledger (a
// service writes it to its database: see examples/postgres). The secrets,
// each required, come from $STRIPE_WEBHOOK_SECRET, $ALIPAY_SIGN_KEY and
// $GITHUB_WEBHOOK_SECRET; a delivery by hand:
//
//	body='{"action":"opened","issue":{"number":1,"title":"Hello"},"repository":{"full_name":"acme/shop"}}'
//	sig=$(printf %s "$body" | openssl dgst -sha256 -hmac "$GITHUB_WEBHOOK_SECRET" | sed 's/.* //')
//	curl -i localhost:8080/github -H 'X-GitHub-Event: issues' -H 'X-GitHub-Delivery: 72d3162e-cc78-11e3-81ab-4c9367dc0958' \
//	    -H "X-Hub-Signature-256: sha256=$sig" -H 'Content-Type: application/json' -d "$body"   # twice: replayed
//
// docs/manual.md (Webhooks and callbacks) gives the reasons for each choice.
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

func main() {
	addr := flag.String("addr", "localhost:8080", "listen address")
	redisAddr := flag.String("redis", "", "Redis address (host:port); default: the in-memory store")
	demo := flag.Bool("demo", false, "serve on a free port, deliver signed events, redeliveries and a forgery to it, print the ledger, and exit")
	flag.Parse()
	log.SetFlags(0)
	if err := run(*addr, *redisAddr, *demo, os.Stdout, os.Stderr); err != nil {
		log.Fatal(err)
	}
}

// secrets are the keys the providers sign with.
type secrets struct{ stripe, alipay, github []byte }

// run serves the receivers until SIGINT or SIGTERM (with demo, on a free
// port while demo.go plays the providers against it, writing to out), then
// shuts down in the order a deploy needs. idem's decisions and the refused
// deliveries are logged to logTo.
func run(addr, redisAddr string, demo bool, out, logTo io.Writer) error {
	var store storage.Store
	if redisAddr == "" {
		ms := memstore.New()
		defer ms.Close() // 3. the store, last
		store = ms
	} else {
		rdb := redis.NewClient(redisstore.ClientOptions(redisAddr))
		defer rdb.Close()
		store = redisstore.New(rdb)
	}
	s := secrets{[]byte(os.Getenv("STRIPE_WEBHOOK_SECRET")), []byte(os.Getenv("ALIPAY_SIGN_KEY")), []byte(os.Getenv("GITHUB_WEBHOOK_SECRET"))}
	var bs *burstStore
	if demo { // demo.go's secrets, and its store that shows a burst's 409s
		bs = &burstStore{Store: store}
		s, store, addr = demoSecrets, bs, "127.0.0.1:0"
	} else if len(s.stripe) == 0 || len(s.alipay) == 0 || len(s.github) == 0 {
		return errors.New("set $STRIPE_WEBHOOK_SECRET, $ALIPAY_SIGN_KEY and $GITHUB_WEBHOOK_SECRET, or run with -demo")
	}
	l := newLedger()
	h, mws, err := newServer(store, s, l, logTo)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)

	var failed error
	if demo {
		failed = play(out, "http://"+ln.Addr().String(), l, bs)
	} else {
		log.Printf("listening on http://%s: POST /stripe, /alipay, /github", ln.Addr())
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		<-ctx.Done()
		stop()
	}
	// 1. the server: no new delivery, the handlers return; 2. each
	// middleware: every record stored; 3. the store (deferred).
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := []error{failed, srv.Shutdown(ctx)}
	for _, m := range mws {
		errs = append(errs, m.Shutdown(ctx))
	}
	return errors.Join(errs...)
}

// newServer builds the three receivers on store, each recording its effect
// in l, and logs idem's decisions and the refused deliveries to logTo. It
// returns their middlewares too, for their Shutdown.
func newServer(store storage.Store, s secrets, l *ledger, logTo io.Writer) (http.Handler, []*idem.Middleware, error) {
	logger := log.New(logTo, "", 0)
	mux := http.NewServeMux()
	var mws []*idem.Middleware
	for _, rc := range []struct {
		provider string
		key      idem.KeySource // where a delivery carries the event's id
		ttl      time.Duration  // longer than the provider redelivers
		verify   verifier
		handle   http.HandlerFunc
	}{
		// Stripe retries an event for up to 3 days, with its id, signed anew.
		{"stripe", idem.KeyFromJSON("id"), 4 * 24 * time.Hour, stripeVerifier(s.stripe), l.stripe},
		// A trade notifies each change of its status (TRADE_SUCCESS, then
		// TRADE_FINISHED or TRADE_CLOSED), each to process once: keyed by
		// trade_no alone, the later ones would get the first one's answer.
		// Alipay redelivers for about 25 hours.
		{"alipay", idem.KeyFromForm("trade_no", "trade_status"), 2 * 24 * time.Hour, alipayVerifier(s.alipay), l.alipay},
		// A redelivery, by hand or by the API, up to 3 days later, keeps
		// X-GitHub-Delivery.
		{"github", idem.KeyFromHeader("X-GitHub-Delivery"), 4 * 24 * time.Hour, githubVerifier(s.github), l.github},
	} {
		m, err := idem.New(store,
			idem.WithKey(rc.key),
			idem.WithScope(func(*http.Request) string { return "webhook:" + rc.provider }), // the sender is the provider, not an Authorization header
			idem.WithTTL(rc.ttl),
			idem.WithMaxRequestBody(maxBody),
			idem.WithObserver(func(ev idem.Event) {
				logger.Printf("idem: %s %s -> %s %d (%v)", ev.Method, ev.Route, ev.Outcome, ev.Status, ev.Duration.Round(time.Microsecond))
			}),
		)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", rc.provider, err)
		}
		mws = append(mws, m)
		// The signature first: a forged delivery must not take the event's key.
		mux.Handle("POST /"+rc.provider, verified(rc.provider, rc.verify, logger, nethttp.Middleware(m)(rc.handle)))
	}
	return mux, mws, nil
}

// stripe processes a Stripe event: a succeeded payment intent is captured.
// Its answer is stored and replayed to every later delivery of the event.
func (l *ledger) stripe(w http.ResponseWriter, r *http.Request) {
	var ev struct {
		Type string `json:"type"`
		Data struct {
			Object struct {
				ID       string `json:"id"`
				Amount   int64  `json:"amount"`
				Currency string `json:"currency"`
			} `json:"object"`
		} `json:"data"`
	}
	if err := json.NewDecoder(r.Body).Decode(&ev); err != nil {
		http.Error(w, "the event is not JSON", http.StatusBadRequest)
		return
	}
	what := "event " + ev.Type + ": nothing to do"
	if o := ev.Data.Object; ev.Type == "payment_intent.succeeded" {
		what = fmt.Sprintf("payment %s captured: %d.%02d %s", o.ID, o.Amount/100, o.Amount%100, strings.ToUpper(o.Currency))
	}
	l.record(r, "stripe", what)
	writeJSON(w, map[string]any{"received": true, "effect": what})
}

// alipay processes an Alipay trade notification and answers "success",
// the only answer that stops Alipay's redeliveries. A failure to process
// it must answer 5xx: idem releases the key and the redelivery runs again,
// where a 4xx would be stored and replayed.
func (l *ledger) alipay(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		http.Error(w, "fail", http.StatusBadRequest)
		return
	}
	trade, status := r.PostForm.Get("trade_no"), r.PostForm.Get("trade_status")
	what := fmt.Sprintf("trade %s %s: nothing to do", trade, status)
	switch status {
	case "TRADE_SUCCESS":
		what = fmt.Sprintf("trade %s paid: %s CNY", trade, r.PostForm.Get("total_amount"))
	case "TRADE_FINISHED":
		what = fmt.Sprintf("trade %s finished: no more refunds", trade)
	case "TRADE_CLOSED":
		what = fmt.Sprintf("trade %s closed", trade)
	}
	l.record(r, "alipay", what)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.WriteString(w, "success")
}

// github processes a GitHub delivery: an opened issue is triaged.
func (l *ledger) github(w http.ResponseWriter, r *http.Request) {
	var p struct {
		Action string `json:"action"`
		Issue  struct {
			Number int    `json:"number"`
			Title  string `json:"title"`
		} `json:"issue"`
		Repository struct {
			FullName string `json:"full_name"`
		} `json:"repository"`
	}
	if err := json.NewDecoder(r.Body).Decode(&p); err != nil {
		http.Error(w, "the payload is not JSON", http.StatusBadRequest)
		return
	}
	event := r.Header.Get("X-GitHub-Event")
	what := "event " + event + ": nothing to do"
	if event == "issues" && p.Action == "opened" {
		what = fmt.Sprintf("issue %s#%d opened: %q triaged", p.Repository.FullName, p.Issue.Number, p.Issue.Title)
	}
	l.record(r, "github", what)
	writeJSON(w, map[string]any{"received": true, "effect": what})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

// ledger stands for the service's database: the receivers make their
// effects in it (its methods stripe, alipay and github are their
// handlers), and it counts how often each event's effect was made.
type ledger struct {
	mu      sync.Mutex
	entries []*ledgerEntry // in the order of the events' first processing
	byEvent map[string]*ledgerEntry
}

// ledgerEntry is one event's effect and how often it was made.
type ledgerEntry struct {
	event, effect string
	times         int
}

func newLedger() *ledger { return &ledger{byEvent: make(map[string]*ledgerEntry)} }

// record makes the effect what of the event that idem runs r's handler
// for: the provider's event of the key idem took.
func (l *ledger) record(r *http.Request, provider, what string) {
	info, _ := idem.FromContext(r.Context())
	event := provider + " " + info.Key
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.byEvent[event]
	if e == nil {
		e = &ledgerEntry{event: event, effect: what}
		l.entries = append(l.entries, e)
		l.byEvent[event] = e
	}
	e.times++
}
