// Command client places orders with the application of examples/nethttp
// through idemclient, the client half of the protocol: one key per order,
// kept across every retry, and the waits the server asks for.
//
//	go run ./examples/client                          # serve the application in-process (memory store), drive it, exit
//	go run ./examples/client -redis localhost:6379    # the same on Redis
//	go run ./examples/client -addr localhost:8080     # drive a running `go run ./examples/nethttp` (or gin, echo)
//
// The part to copy is in this file: newClient (an http.Client whose
// Transport is idemclient's), logAttempt (every attempt in the log, never
// the key) and placeOrder (one order under one key). demo.go places three
// orders with them and prints every attempt and Result: a response lost
// after the server committed, retried with the same key and replayed; a
// double click (two calls with one key at once) whose second call waits
// out its 409 and gets the first one's response; that key again with
// another body, answered 422 and not retried. server.go is the application
// served in-process when -addr is not given.
//
// It exits with status 1 if any call did not end as the kit promises.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/idemkit/idem/idemclient"
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

// run plays the demo against the server at addr, or, when addr is empty,
// against the application served in-process on redisAddr's store (the
// memory store when empty), its log (the middleware's decisions) to logw.
// It writes the transcript to out and returns an error for every call that
// did not end as promised.
func run(addr, redisAddr string, out, logw io.Writer) error {
	if addr != "" {
		return play(out, "http://"+strings.TrimPrefix(addr, "http://"))
	}
	base, stop, err := serve(redisAddr, logw)
	if err != nil {
		return err
	}
	return errors.Join(play(out, base), stop())
}

// newClient returns the client of the order service, over base (the
// network: an *http.Transport). Its transport gives every POST and PATCH
// one key, the caller's (idemclient.WithKey) or one of its own, and keeps
// it across every retry; it retries what is safe, waits Retry-After, and
// logs every attempt (logAttempt).
func newClient(base http.RoundTripper) *http.Client {
	return &http.Client{
		Transport: idemclient.New(
			idemclient.WithBase(base),
			idemclient.WithAttemptHook(logAttempt),
		),
		Timeout: time.Minute, // bounds the attempts and the waits too
	}
}

// logKey is the context key of a call's logger (withLogger).
type logKey struct{}

// withLogger returns ctx with the logger of the call it is for: the
// logger's prefix names the call, logAttempt writes its attempts.
func withLogger(ctx context.Context, l *log.Logger) context.Context {
	return context.WithValue(ctx, logKey{}, l)
}

// logAttempt is the transport's attempt hook: it logs an attempt's outcome
// and the wait before the next one to the call's logger (withLogger), else
// to the standard logger. An Attempt never holds the key.
func logAttempt(a idemclient.Attempt) {
	l, ok := a.Context.Value(logKey{}).(*log.Logger)
	if !ok {
		l = log.Default()
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
	l.Print(b.String())
}

// reply is the service's answer to an order.
type reply struct {
	status int
	header http.Header
	body   []byte
	res    idemclient.Result // how many attempts, and whether it was replayed
}

// placeOrder posts an order (a JSON body) to url through client. key is
// the order's idempotency key: save it with the order, so that every call
// for this order, after a restart too, sends the same one. With key empty,
// the transport makes one for this call and its retries only.
//
// An error means the order's outcome is unknown: it exists once or not at
// all. A later call with the same key tells which (the stored response,
// replayed), and never places it twice.
func placeOrder(ctx context.Context, client *http.Client, url, key, body string) (*reply, error) {
	if key != "" {
		ctx = idemclient.WithKey(ctx, key)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	r := &reply{status: resp.StatusCode, header: resp.Header}
	r.res, _ = idemclient.ResultOf(resp)
	r.body, err = io.ReadAll(resp.Body)
	return r, err
}
