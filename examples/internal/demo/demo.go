// Package demo is what the examples that are not yet self-contained
// (client, form, gateway, postgres, statemachine, webhooks) share;
// examples/nethttp, examples/gin and examples/echo carry their own copy of
// what they need (main.go, demo.go), so that a user can copy them. It
// holds the flags, the choice of store, the server loop ([Serve]), a
// scripted client that plays a retry, a reused key and a double click
// ([Client]), and a burst of duplicates ([Duplicates]).
//
// Each example is the same application, an order endpoint:
//
//	POST /orders   {"item":"book","amount":12}
//	-> 201 {"amount":12,"handler_runs":1,"item":"book","order":1}
//
// where handler_runs counts how often the handler really ran, so the effect
// of the middleware is visible in every answer.
package demo

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
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
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/memstore"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/redis/go-redis/v9"
)

// Order is the request body of POST /orders.
type Order struct {
	Item   string `json:"item"`
	Amount int    `json:"amount"`
}

// NewServer builds an example's application on store. env gives it the
// observer to install and the hook for slow requests. It returns the
// application's handler and its idem middleware, which is shut down after
// the server.
type NewServer func(store storage.Store, env *Env) (http.Handler, *idem.Middleware, error)

// Main is an example's main function: it parses the flags
//
//	-addr localhost:8080   listen address
//	-redis host:port       use Redis; default: the in-memory store
//	-demo                  serve on a free port, run the scripted client, exit
//
// builds the application with newServer and serves it with [Serve]: until
// SIGINT or SIGTERM, or, with -demo, while [Client] runs against it; it
// exits with status 1 if any answer was not the one the kit promises.
func Main(newServer NewServer) {
	log.SetFlags(0)
	addr := flag.String("addr", "localhost:8080", "listen address")
	redisAddr := flag.String("redis", "", "Redis address (host:port); default: the in-memory store")
	demo := flag.Bool("demo", false, "serve on a free port, run a scripted client against it, and exit")
	flag.Parse()

	store, closeStore := OpenStore(*redisAddr)
	env := NewEnv(os.Stderr)
	h, m, err := newServer(store, env)
	if err != nil {
		closeStore()
		log.Fatal(err)
	}
	var client func(base string) error
	if *demo {
		client = func(base string) error { return Client(os.Stdout, base) }
	}
	app := App{Handler: h, Middlewares: []*idem.Middleware{m}, CloseStore: closeStore, StoreName: StoreName(*redisAddr)}
	if err := Serve(*addr, app, client); err != nil {
		log.Fatal(err)
	}
}

// App is an example application, for [Serve].
type App struct {
	Handler     http.Handler
	Middlewares []*idem.Middleware // shut down after the server, in order
	CloseStore  func()             // called last, always
	StoreName   string             // for the log: which store serves
	// Try is what the log suggests to run once it listens, each line with
	// %[1]s for the address; default, a curl of POST /orders.
	Try []string
}

// defaultTry is App.Try's default.
var defaultTry = []string{`curl -i -X POST http://%[1]s/orders -H 'Content-Type: application/json' -H 'Idempotency-Key: order-1' -d '{"item":"book","amount":12}'`}

// Serve serves app on addr until SIGINT or SIGTERM; or, when client is
// not nil, on a free loopback port while client runs against it (base is
// "http://host:port"). Either way it then shuts down in the order a deploy
// needs (see [Shutdown]): the server (no new request; the handlers
// finish), then the middlewares (their records are stored), then the
// store, with app.CloseStore, which Serve always calls. It returns the
// error of client, of the listener or of the shutdown.
func Serve(addr string, app App, client func(base string) error) error {
	if client != nil {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		app.CloseStore()
		return err
	}
	srv := &http.Server{Handler: app.Handler, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)

	var failed error
	if client != nil {
		failed = client("http://" + ln.Addr().String())
	} else {
		try := app.Try
		if try == nil {
			try = defaultTry
		}
		log.Printf("listening on http://%s (store: %s); try:", ln.Addr(), app.StoreName)
		for _, line := range try {
			log.Printf("  "+line, ln.Addr())
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		<-ctx.Done()
		stop()
		log.Print("shutting down")
	}
	return errors.Join(failed, Shutdown(srv, app.CloseStore, 30*time.Second, app.Middlewares...))
}

// Shutdown stops an application in the order a deploy needs, within
// timeout: srv.Shutdown (no new request; the handlers return), then each
// middleware's Shutdown (their records are stored, background retries
// included), then closeStore.
func Shutdown(srv *http.Server, closeStore func(), timeout time.Duration, ms ...*idem.Middleware) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	defer closeStore()
	if err := srv.Shutdown(ctx); err != nil {
		return fmt.Errorf("server shutdown: %w", err)
	}
	errs := make([]error, len(ms))
	for i, m := range ms {
		errs[i] = m.Shutdown(ctx)
	}
	return errors.Join(errs...)
}

// OpenStore returns the in-memory store for an empty addr, else a Redis
// store on addr with the client options the README recommends for a
// request path (a request gets its 503 within about half a second while
// Redis is unreachable), and the function that closes it.
func OpenStore(addr string) (storage.Store, func()) {
	if addr == "" {
		s := memstore.New()
		return s, func() { s.Close() }
	}
	rdb := redis.NewClient(redisstore.ClientOptions(addr))
	return redisstore.New(rdb), func() { rdb.Close() }
}

// StoreName says which store OpenStore(addr) opens, for a log.
func StoreName(addr string) string {
	if addr == "" {
		return "memory"
	}
	return "redis " + addr
}

// Env is what an example's application gets besides its store.
type Env struct {
	log *log.Logger

	mu sync.Mutex
	// clicks holds the double clicks under way, by Idempotency-Key. Slow
	// removes its own; a 409 that comes after its request stopped waiting
	// (3 s) leaves one finished entry behind, which nothing waits on.
	clicks map[string]*click
}

// click is one double click: done is closed once a duplicate of the
// request in flight has been turned away with 409.
type click struct {
	done   chan struct{}
	closed bool
}

// NewEnv returns an Env that logs the middleware's decisions to w (nil:
// no log).
func NewEnv(w io.Writer) *Env {
	if w == nil {
		w = io.Discard
	}
	return &Env{log: log.New(w, "", 0), clicks: make(map[string]*click)}
}

// Observe is the idem observer the examples install with
// idem.WithObserver: it logs each decision.
func (e *Env) Observe(ev idem.Event) {
	e.log.Printf("idem: %s %s -> %s %d (%v)", ev.Method, ev.Route, ev.Outcome, ev.Status, ev.Duration.Round(time.Microsecond))
}

// WriteError is the idem error writer the examples install with
// idem.WithErrorWriter. It writes idem's default problem+json body
// ([idem.WriteProblem]); when that body is the 409 for a duplicate of a
// ?slow=1 request still in flight, it also lets that request go on (see
// [Env.Slow]).
func (e *Env) WriteError(w http.ResponseWriter, r *http.Request, err *idem.Error) {
	if errors.Is(err, idem.ErrConflict) && r.URL.Query().Get("slow") != "" {
		e.mu.Lock()
		c := e.click(r.Header.Get("Idempotency-Key"))
		if !c.closed {
			c.closed = true
			close(c.done)
		}
		e.mu.Unlock()
	}
	idem.WriteProblem(w, r, err)
}

// click returns the double click of key, made on first use; e.mu is held.
func (e *Env) click(key string) *click {
	c, ok := e.clicks[key]
	if !ok {
		c = &click{done: make(chan struct{})}
		e.clicks[key] = c
	}
	return c
}

// Slow holds a request whose query has slow=1 until the middleware has
// turned away a duplicate of it (same Idempotency-Key) with 409, or for 3
// seconds, so that the scripted client shows a double click without
// guessing timings. Each key is a double click of its own, so any number
// of them, one after the other or at once, work on one Env. Other requests
// pass at once.
func (e *Env) Slow(r *http.Request) {
	if r.URL.Query().Get("slow") == "" {
		return
	}
	key := r.Header.Get("Idempotency-Key")
	e.mu.Lock()
	c := e.click(key) // the 409 may have come first: then done is closed
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		if e.clicks[key] == c {
			delete(e.clicks, key)
		}
		e.mu.Unlock()
	}()
	t := time.NewTimer(3 * time.Second)
	defer t.Stop()
	select {
	case <-c.done:
	case <-t.C:
	case <-r.Context().Done():
	}
}

// step is one request of the scripted client and the answer it must get.
type step struct {
	title, key, body, query string
	status                  int
	replayed                bool
}

// answer is what the client got.
type answer struct {
	status int
	header http.Header
	body   []byte
}

// Client plays the scripted client against base ("http://host:port"),
// writing a curl-like transcript to out: a first call, its retry (replayed,
// the handler does not run again), the same key with a different body
// (422), and a double click while the first request still runs (one 201,
// one 409). It returns an error describing every answer that was not the
// promised one.
//
// Each call uses keys of its own, order-1-RUN and order-2-RUN where RUN is
// 8 random hex digits ([RunID]), as a real client makes a new key per
// operation: any number of runs, in one process or in several against one
// Redis, get the same answers.
func Client(out io.Writer, base string) error {
	run, err := RunID()
	if err != nil {
		return err
	}
	return ClientRun(out, base, run)
}

// ClientRun is [Client] with the keys' RUN given by the caller, who can then
// look them up: order-1-RUN (the first call, its retry and the different
// body) and order-2-RUN (the double click).
func ClientRun(out io.Writer, base, run string) error {
	var errs []error
	check := func(s step, a answer, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s.title, err))
			return
		}
		printAnswer(out, base, s, a)
		if a.status != s.status || (a.header.Get("Idempotent-Replayed") == "true") != s.replayed {
			errs = append(errs, fmt.Errorf("%s: got %d (replayed %q), want %d (replayed %v)",
				s.title, a.status, a.header.Get("Idempotent-Replayed"), s.status, s.replayed))
		}
	}
	order1 := `{"item":"book","amount":12}`
	for _, s := range []step{
		{title: "first call: the handler runs", key: "order-1-" + run, body: order1, status: http.StatusCreated},
		{title: "the client retries: replayed, the handler does not run again", key: "order-1-" + run, body: order1, status: http.StatusCreated, replayed: true},
		{title: "same key, different body: refused", key: "order-1-" + run, body: `{"item":"book","amount":99}`, status: http.StatusUnprocessableEntity},
	} {
		a, err := send(base, s)
		check(s, a, err)
	}

	// A double click: two identical requests at once. Whichever takes the
	// key first runs (held by Env.Slow until the other was turned away);
	// the other gets 409.
	click := step{key: "order-2-" + run, body: `{"item":"pen","amount":3}`, query: "?slow=1"}
	type result struct {
		a   answer
		err error
	}
	results := make(chan result, 2)
	for range 2 {
		go func() {
			a, err := send(base, click)
			results <- result{a, err}
		}()
	}
	first, second := <-results, <-results
	if second.err == nil && second.a.status == http.StatusConflict {
		first, second = second, first // show the 409 first, whichever came back first
	}
	click.title, click.status = "a double click while the first request is still running: conflict", http.StatusConflict
	check(click, first.a, first.err)
	click.title, click.status = "the first request of the double click completes", http.StatusCreated
	check(click, second.a, second.err)
	return errors.Join(errs...)
}

// Duplicates sends n identical requests at once, with one key and one body
// (a client's retries racing each other, or n copies of one job), writes
// to out the answer of the request the handler ran for and how many of each
// answer came back, and returns an error unless the handler ran for exactly
// one of them (201 without Idempotent-Replayed) and each other got either
// 409 (the first was still in flight) or a replay of it: Idempotent-Replayed:
// true, and the same status, Location and body, byte for byte.
func Duplicates(out io.Writer, base, key, body string, n int) error {
	s := step{title: fmt.Sprintf("%d identical requests at once (one key): the handler runs for one, the others get 409 or its replay", n),
		key: key, body: body, status: http.StatusCreated}
	answers := make([]answer, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			answers[i], errs[i] = send(base, s)
		})
	}
	close(start)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%s: %w", s.title, err)
	}
	var ran, replays []answer
	conflicts := 0
	for _, a := range answers {
		switch {
		case a.header.Get("Idempotent-Replayed") == "true":
			replays = append(replays, a)
		case a.status == http.StatusConflict:
			conflicts++
		default:
			ran = append(ran, a)
		}
	}
	if len(ran) != 1 || ran[0].status != http.StatusCreated {
		var got []string
		for _, a := range ran {
			got = append(got, fmt.Sprintf("%d %s", a.status, bytes.TrimSpace(a.body)))
		}
		return fmt.Errorf("%s: the handler answered %d of them, want 1 with 201: %q", s.title, len(ran), got)
	}
	first := ran[0]
	printAnswer(out, base, s, first)
	fmt.Fprintf(out, "the %d others: %d x 201 with Idempotent-Replayed: true and this body, %d x 409\n", n-1, len(replays), conflicts)
	for _, a := range replays {
		if a.status != first.status || a.header.Get("Location") != first.header.Get("Location") || !bytes.Equal(a.body, first.body) {
			return fmt.Errorf("%s: a replay differs from the original: %d %q %q, want %d %q %q", s.title,
				a.status, a.header.Get("Location"), a.body, first.status, first.header.Get("Location"), first.body)
		}
	}
	return nil
}

// RunID returns 8 random hex digits, which tell the keys of one run of the
// scripted client from those of every other run.
func RunID() (string, error) {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("demo: run id: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

func send(base string, s step) (answer, error) {
	req, err := http.NewRequest(http.MethodPost, base+"/orders"+s.query, strings.NewReader(s.body))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", s.key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return answer{res.StatusCode, res.Header, b}, err
}

func printAnswer(out io.Writer, base string, s step, a answer) {
	fmt.Fprintf(out, "\n# %s\n$ curl -X POST '%s/orders%s' -H 'Content-Type: application/json' -H 'Idempotency-Key: %s' -d '%s'\nHTTP %d",
		s.title, base, s.query, s.key, s.body, a.status)
	for _, h := range []string{"Idempotent-Replayed", "Retry-After", "Content-Type"} {
		if v := a.header.Get(h); v != "" {
			fmt.Fprintf(out, "  %s: %s", h, v)
		}
	}
	fmt.Fprintf(out, "\n%s\n", strings.TrimRight(string(a.body), "\n"))
}
