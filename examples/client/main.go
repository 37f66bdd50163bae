// Command client drives the order application of examples/nethttp with
// idemclient, the client half of the protocol: one key per order, kept
// across every retry, and the waits the server asks for.
//
//	go run ./examples/client                          # serve the application in-process (memory store), drive it, exit
//	go run ./examples/client -redis localhost:6379    # the same on Redis
//	go run ./examples/client -addr localhost:8080     # drive a running `go run ./examples/nethttp` (or gin, echo)
//
// It makes three calls through &http.Client{Transport: idemclient.New(...)}
// and prints every attempt (WithAttemptHook) and every call's Result:
//
//  1. An order whose first response is lost on the way back: the client's
//     network (a RoundTripper under the transport) lets the request reach
//     the server and drops the answer, a timeout after the server
//     committed. The transport retries with the same key and gets the
//     stored response, replayed: the handler ran once.
//  2. A double click: two calls at once with one key (idemclient.WithKey),
//     to ?slow=1, which holds the first in the handler until a duplicate
//     is turned away. The other is told 409 with Retry-After, waits it,
//     and gets the first one's response, replayed.
//  3. That key again with another body: 422, returned at once, never
//     retried.
//
// It exits with status 1 if any call did not end as the kit promises.
// Each run uses a key of its own for the double click (order-2- and 8
// random hex digits), so runs can follow one another against one server.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"github.com/idemkit/idem/examples/democlient"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/memstore"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/redis/go-redis/v9"
)

func main() {
	log.SetFlags(0)
	addr := flag.String("addr", "", "host:port of a running order example (go run ./examples/nethttp); default: serve one in-process")
	redisAddr := flag.String("redis", "", "in-process server: Redis address (host:port); default: the in-memory store")
	flag.Parse()
	if err := run(*addr, *redisAddr, os.Stdout, os.Stderr); err != nil {
		log.Fatal(err)
	}
}

// run drives the server at addr, or, when addr is empty, the application
// of examples/nethttp served in-process on redisAddr's store (the memory
// store when empty), its log (the middleware's decisions) to logw. It
// writes the transcript to out and returns an error for every call that
// did not end as promised.
func run(addr, redisAddr string, out, logw io.Writer) error {
	if addr != "" {
		return play(out, "http://"+strings.TrimPrefix(addr, "http://"))
	}
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
	h, m, err := newServer(store, logw, democlient.NewClicks())
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	failed := play(out, "http://"+ln.Addr().String())
	// 1. the server, 2. idem: every record stored, 3. the store (deferred).
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return errors.Join(failed, srv.Shutdown(ctx), m.Shutdown(ctx))
}

// lossy is the client's network: it loses the response of the next
// request when told to, after the server answered, as a timeout does.
type lossy struct {
	base http.RoundTripper
	lose atomic.Bool

	mu   sync.Mutex
	lost *answer // the response it lost
}

// errLost is what the lost attempt returns: a timeout, as the client's
// deadline would report one.
type errLost struct{ status int }

func (e errLost) Error() string {
	return fmt.Sprintf("simulated timeout: the server answered %d, the response was lost on the way back", e.status)
}
func (errLost) Timeout() bool { return true }

func (l *lossy) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := l.base.RoundTrip(r)
	if err != nil || !l.lose.CompareAndSwap(true, false) {
		return resp, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.lost = &answer{status: resp.StatusCode, header: resp.Header, body: body}
	l.mu.Unlock()
	return nil, errLost{resp.StatusCode}
}

// answer is what a call got.
type answer struct {
	status int
	header http.Header
	body   []byte
	res    idemclient.Result
	lines  []string // its attempts, as the hook saw them
}

func (a *answer) replayed() bool { return a.header.Get("Idempotent-Replayed") == "true" }

// attempts collects a call's attempts, for the hook; it travels in the
// call's context.
type attempts struct {
	mu    sync.Mutex
	lines []string
}

type attemptsKey struct{}

// hook describes every attempt: its outcome, how long it took, and the
// wait before the next one. It never sees the key.
func hook(a idemclient.Attempt) {
	l, ok := a.Context.Value(attemptsKey{}).(*attempts)
	if !ok {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "attempt %d: ", a.N)
	if a.Err != nil {
		fmt.Fprintf(&b, "error: %v", a.Err)
	} else {
		fmt.Fprintf(&b, "%d", a.StatusCode)
		if a.Replayed {
			b.WriteString(" Idempotent-Replayed: true")
		}
		if ra := a.Header.Get("Retry-After"); ra != "" {
			fmt.Fprintf(&b, " Retry-After: %s", ra)
		}
	}
	if a.Retry {
		fmt.Fprintf(&b, "; retry in %v", a.Wait.Round(time.Millisecond))
	}
	l.mu.Lock()
	l.lines = append(l.lines, b.String())
	l.mu.Unlock()
}

// player makes the calls.
type player struct {
	out    io.Writer
	base   string
	client *http.Client
	net    *lossy
	errs   []error
}

// play makes the three calls against base ("http://host:port"), writes
// what happened to out, and returns an error for every call that did not
// end as promised.
func play(out io.Writer, base string) error {
	var rnd [4]byte
	rand.Read(rnd[:])
	run := hex.EncodeToString(rnd[:]) // this run's keys differ from every other run's
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	n := &lossy{base: tr}
	p := &player{out: out, base: base, net: n, client: &http.Client{
		// One key per call, kept across every retry; waits Retry-After.
		Transport: idemclient.New(
			idemclient.WithBase(n),
			idemclient.WithAttemptHook(hook),
		),
		Timeout: time.Minute, // bounds the attempts and the waits too
	}}
	fmt.Fprintf(out, "idemclient against %s/orders\n", base)
	p.lostResponse()
	key := "order-2-" + run
	p.doubleClick(key)
	p.reusedKey(key)
	return errors.Join(p.errs...)
}

func (p *player) fail(format string, args ...any) {
	err := fmt.Errorf(format, args...)
	p.errs = append(p.errs, err)
	fmt.Fprintf(p.out, "FAIL: %v\n", err)
}

// call sends POST /orders<query> with body through the client, under key
// when not empty (idemclient.WithKey), else under one the transport makes.
func (p *player) call(query, key, body string) (*answer, error) {
	l := &attempts{}
	ctx := context.WithValue(context.Background(), attemptsKey{}, l)
	if key != "" {
		ctx = idemclient.WithKey(ctx, key)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.base+"/orders"+query, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, err // the order may exist, once: retry later with the same key
	}
	defer resp.Body.Close()
	a := &answer{status: resp.StatusCode, header: resp.Header}
	a.res, _ = idemclient.ResultOf(resp)
	a.body, err = io.ReadAll(resp.Body)
	l.mu.Lock()
	a.lines = l.lines
	l.mu.Unlock()
	return a, err
}

// show prints a call's attempts and Result, with prefix before each line.
func (p *player) show(prefix string, a *answer) {
	for _, line := range a.lines {
		fmt.Fprintf(p.out, "%s%s\n", prefix, line)
	}
	fmt.Fprintf(p.out, "%sResult: attempts=%d replayed=%t\n", prefix, a.res.Attempts, a.res.Replayed)
}

// showResponse prints a response as the other examples do.
func (p *player) showResponse(a *answer) {
	fmt.Fprintf(p.out, "HTTP %d", a.status)
	for _, h := range []string{"Idempotent-Replayed", "Retry-After", "Content-Type"} {
		if v := a.header.Get(h); v != "" {
			fmt.Fprintf(p.out, "  %s: %s", h, v)
		}
	}
	fmt.Fprintf(p.out, "\n%s\n", bytes.TrimRight(a.body, "\n"))
}

// lostResponse: the first response is lost after the server committed;
// the retry, with the same key, gets it replayed.
func (p *player) lostResponse() {
	const body = `{"item":"book","amount":12}`
	fmt.Fprintf(p.out, "\n# 1. the network loses the first response: the retry, with the same key, is replayed\n")
	fmt.Fprintf(p.out, "POST /orders %s (a key made by the transport)\n", body)
	p.net.lose.Store(true)
	a, err := p.call("", "", body)
	if err != nil {
		p.fail("lost response: %v", err)
		return
	}
	p.show("  ", a)
	p.showResponse(a)
	p.net.mu.Lock()
	lost := p.net.lost
	p.net.mu.Unlock()
	same := lost != nil && lost.status == a.status && bytes.Equal(lost.body, a.body)
	fmt.Fprintf(p.out, "the lost response and the replay: the same bytes: %t\n", same)
	if a.status != http.StatusCreated || !a.replayed() || !a.res.Replayed || a.res.Attempts != 2 || !same {
		p.fail("lost response: %d replayed=%t after %d attempts, the same bytes as the lost one: %t; want 201 replayed after 2",
			a.status, a.res.Replayed, a.res.Attempts, same)
	}
}

// doubleClick: two calls at once with one key, the first held in the
// handler; the other waits out its 409 and gets the first's response.
func (p *player) doubleClick(key string) {
	const body = `{"item":"pen","amount":3}`
	fmt.Fprintf(p.out, "\n# 2. a double click: two calls at once with one key, while the first runs (?slow=1)\n")
	fmt.Fprintf(p.out, "POST /orders?slow=1 %s twice, Idempotency-Key: %s (idemclient.WithKey)\n", body, key)
	var (
		wg      sync.WaitGroup
		answers [2]*answer
		errs    [2]error
	)
	for i := range answers {
		wg.Go(func() { answers[i], errs[i] = p.call("?slow=1", key, body) })
	}
	wg.Wait()
	if err := errors.Join(errs[:]...); err != nil {
		p.fail("double click: %v", err)
		return
	}
	ran, waited := answers[0], answers[1]
	if ran.replayed() {
		ran, waited = waited, ran
	}
	fmt.Fprintln(p.out, "the call that ran the handler:")
	p.show("  ", ran)
	fmt.Fprintln(p.out, "the call that waited:")
	p.show("  ", waited)
	p.showResponse(waited)
	same := ran.status == waited.status && bytes.Equal(ran.body, waited.body)
	fmt.Fprintf(p.out, "both calls got the same bytes: %t\n", same)
	switch {
	case ran.status != http.StatusCreated || ran.replayed() || ran.res.Attempts != 1:
		p.fail("double click: the call that ran got %d replayed=%t after %d attempts, want 201 after 1", ran.status, ran.replayed(), ran.res.Attempts)
	case !waited.replayed() || waited.res.Attempts < 2 || !strings.HasPrefix(waited.lines[0], "attempt 1: 409"):
		p.fail("double click: the other call got %d replayed=%t after %d attempts %q, want 409, then the replay", waited.status, waited.replayed(), waited.res.Attempts, waited.lines)
	case !same:
		p.fail("double click: the two calls got different responses")
	}
}

// reusedKey: the key of the double click with another body: 422, which
// the transport returns at once.
func (p *player) reusedKey(key string) {
	const body = `{"item":"pen","amount":30}`
	fmt.Fprintf(p.out, "\n# 3. the same key, another body: refused, and not retried\n")
	fmt.Fprintf(p.out, "POST /orders?slow=1 %s, Idempotency-Key: %s\n", body, key)
	a, err := p.call("?slow=1", key, body)
	if err != nil {
		p.fail("reused key: %v", err)
		return
	}
	p.show("  ", a)
	p.showResponse(a)
	if a.status != http.StatusUnprocessableEntity || a.res.Attempts != 1 {
		p.fail("reused key: %d after %d attempts, want 422 after 1", a.status, a.res.Attempts)
	}
}
