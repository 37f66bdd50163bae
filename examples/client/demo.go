package main

// This file is the demo: three orders placed with newClient and
// placeOrder, each attempt and Result printed, and checked against what
// the kit promises.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
)

// lossy is the client's network: it loses the response of the next
// request when told to, after the server answered, as a timeout does.
type lossy struct {
	base http.RoundTripper
	lose atomic.Bool

	mu   sync.Mutex
	lost *reply // the response it lost
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
	l.lost = &reply{status: resp.StatusCode, header: resp.Header, body: body}
	l.mu.Unlock()
	return nil, errLost{resp.StatusCode}
}

// answer is what a call got, and its attempts as logAttempt logged them.
type answer struct {
	*reply
	attempts string // one line per attempt, each indented by two spaces
}

func (a *answer) replayed() bool { return a.header.Get("Idempotent-Replayed") == "true" }

// player places the orders.
type player struct {
	out    io.Writer
	orders string // the URL of POST /orders
	client *http.Client
	net    *lossy
	errs   []error
}

// play places the three orders against base ("http://host:port"), writes
// what happened to out, and returns an error for every call that did not
// end as promised. The double click's key is this run's own (order-2- and
// 8 random hex digits), so that runs can follow one another against one
// server.
func play(out io.Writer, base string) error {
	var rnd [4]byte
	rand.Read(rnd[:])
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	n := &lossy{base: tr}
	p := &player{out: out, orders: base + "/orders", net: n, client: newClient(n)}
	fmt.Fprintf(out, "idemclient against %s/orders\n", base)
	p.lostResponse()
	key := "order-2-" + hex.EncodeToString(rnd[:])
	p.doubleClick(key)
	p.reusedKey(key)
	return errors.Join(p.errs...)
}

func (p *player) fail(format string, args ...any) {
	err := fmt.Errorf(format, args...)
	p.errs = append(p.errs, err)
	fmt.Fprintf(p.out, "FAIL: %v\n", err)
}

// call places an order with body at POST /orders<query>, under key (empty:
// one the transport makes), and collects its attempts.
func (p *player) call(query, key, body string) (*answer, error) {
	var attempts bytes.Buffer
	ctx := withLogger(context.Background(), log.New(&attempts, "  ", 0))
	r, err := placeOrder(ctx, p.client, p.orders+query, key, body)
	if err != nil {
		return nil, err
	}
	return &answer{reply: r, attempts: attempts.String()}, nil
}

// show prints a call's attempts and Result.
func (p *player) show(a *answer) {
	fmt.Fprintf(p.out, "%s  Result: attempts=%d replayed=%t\n", a.attempts, a.res.Attempts, a.res.Replayed)
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
	p.show(a)
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
// handler (?slow=1); the other waits out its 409 and gets the first's
// response.
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
	p.show(ran)
	fmt.Fprintln(p.out, "the call that waited:")
	p.show(waited)
	p.showResponse(waited)
	same := ran.status == waited.status && bytes.Equal(ran.body, waited.body)
	fmt.Fprintf(p.out, "both calls got the same bytes: %t\n", same)
	switch {
	case ran.status != http.StatusCreated || ran.replayed() || ran.res.Attempts != 1:
		p.fail("double click: the call that ran got %d replayed=%t after %d attempts, want 201 after 1", ran.status, ran.replayed(), ran.res.Attempts)
	case !waited.replayed() || waited.res.Attempts < 2 || !strings.HasPrefix(waited.attempts, "  attempt 1: 409"):
		p.fail("double click: the other call got %d replayed=%t after %d attempts %q, want 409, then the replay", waited.status, waited.replayed(), waited.res.Attempts, waited.attempts)
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
	p.show(a)
	p.showResponse(a)
	if a.status != http.StatusUnprocessableEntity || a.res.Attempts != 1 {
		p.fail("reused key: %d after %d attempts, want 422 after 1", a.status, a.res.Attempts)
	}
}
