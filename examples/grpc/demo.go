package main

// This file is the demo that -demo runs: a scripted client that calls the
// service through grpcidem's client interceptor, prints what each call
// got and checks it against what the kit promises; and the server
// interceptor that holds the first call of its double call in the
// handler until the second was turned away, so that the demo shows a call
// in flight on any machine.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/grpcidem"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// demoClient is the scripted client of one run.
type demoClient struct {
	run              string        // the run's id, in its keys: runs against one Redis do not meet
	entered, release chan struct{} // the double call: its first call is in the handler; its second was turned away
	enter, free      sync.Once
}

func newDemoClient() *demoClient {
	var b [4]byte
	rand.Read(b[:])
	return &demoClient{run: hex.EncodeToString(b[:]), entered: make(chan struct{}), release: make(chan struct{})}
}

// key returns the key of the run's order n.
func (d *demoClient) key(n int) string { return fmt.Sprintf("order-%d-%s", n, d.run) }

// hold is a server interceptor, inside idem's: the handler of the double
// call's key waits until its duplicate got Aborted (at most 5 s).
func (d *demoClient) hold(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if info, ok := idem.FromContext(ctx); ok && info.Key == d.key(2) {
		d.enter.Do(func() { close(d.entered) })
		t := time.NewTimer(5 * time.Second)
		defer t.Stop()
		select {
		case <-d.release:
		case <-t.C:
		case <-ctx.Done():
		}
	}
	return h(ctx, req)
}

// answer is what one call got, and its attempts.
type answer struct {
	err      error
	header   metadata.MD
	body     string // the response as JSON
	attempts []grpcidem.Attempt
}

// replayed reports whether the answer is marked as a replay.
func (a *answer) replayed() bool {
	return strings.Join(a.header.Get(grpcidem.ReplayedHeader), "") == "true"
}

// attemptsKey is the context key under which a call keeps its attempts.
type attemptsKey struct{}

// attempt is the interceptor's hook: it keeps the attempt with its call
// and lets the double call's first call go on once the second got Aborted.
func (d *demoClient) attempt(a grpcidem.Attempt) {
	if ans, ok := a.Context.Value(attemptsKey{}).(*answer); ok {
		ans.attempts = append(ans.attempts, a)
	}
	if a.Code == codes.Aborted {
		d.free.Do(func() { close(d.release) })
	}
}

// call creates an order of item and amount with key.
func (d *demoClient) call(conn *grpc.ClientConn, key, item string, amount float64) *answer {
	a := new(answer)
	ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), attemptsKey{}, a), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, grpcidem.DefaultKeyHeader, key)
	req, _ := structpb.NewStruct(map[string]any{"item": item, "amount": amount})
	var resp structpb.Struct
	if a.err = conn.Invoke(ctx, createMethod, req, &resp, grpc.Header(&a.header)); a.err == nil {
		b, _ := json.Marshal(resp.AsMap())
		a.body = string(b)
	}
	return a
}

// play runs the script against the server at addr, writes the transcript
// to out, and returns an error for each answer that is not the promised
// one.
func (d *demoClient) play(out io.Writer, addr string) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(grpcidem.UnaryClientInterceptor(grpcidem.WithAttemptHook(d.attempt))))
	if err != nil {
		return err
	}
	defer conn.Close()
	var errs []error
	step := func(title, key, item string, amount float64, a *answer, ok bool) {
		fmt.Fprintf(out, "# %s\n$ Create idempotency-key: %s  {\"amount\":%v,\"item\":%q}\n", title, key, amount, item)
		for _, at := range a.attempts {
			fmt.Fprintf(out, "attempt %d: %v", at.N, at.Code)
			if ra := at.Header.Get(grpcidem.RetryAfterHeader); at.Retry && len(ra) == 1 {
				fmt.Fprintf(out, ", retry-after: %s: the client waits, then retries with the same key", ra[0])
			}
			fmt.Fprintln(out)
		}
		if a.err != nil {
			fmt.Fprintf(out, "%v %s: %s\n\n", status.Code(a.err), grpcidem.Reason(a.err), status.Convert(a.err).Message())
		} else {
			fmt.Fprintf(out, "OK  order-id: %s", strings.Join(a.header.Get("order-id"), ","))
			if a.replayed() {
				fmt.Fprint(out, "  idempotent-replayed: true")
			}
			fmt.Fprintf(out, "\n%s\n\n", a.body)
		}
		if !ok {
			errs = append(errs, fmt.Errorf("%s: not the promised answer (%v, replayed %v, %d attempts)", title, status.Code(a.err), a.replayed(), len(a.attempts)))
		}
	}

	first := d.call(conn, d.key(1), "book", 12)
	step("an order: the handler runs", d.key(1), "book", 12, first,
		first.err == nil && !first.replayed() && strings.Contains(first.body, `"handler_runs":1,`))
	again := d.call(conn, d.key(1), "book", 12)
	step("the client sends it again (the answer was lost, say): replayed, the handler does not run", d.key(1), "book", 12, again,
		again.err == nil && again.replayed() && again.body == first.body)

	held := make(chan *answer, 1)
	go func() { held <- d.call(conn, d.key(2), "pen", 3) }()
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	select {
	case <-d.entered:
	case <-t.C:
		errs = append(errs, errors.New("the double call's first call did not reach the handler"))
	}
	second := d.call(conn, d.key(2), "pen", 3)
	one := <-held
	step("a double call, the first: the handler runs", d.key(2), "pen", 3, one,
		one.err == nil && !one.replayed() && strings.Contains(one.body, `"handler_runs":2,`))
	step("a double call, the second, sent while the first ran: Aborted, then replayed", d.key(2), "pen", 3, second,
		second.err == nil && second.replayed() && second.body == one.body && len(second.attempts) > 1 && second.attempts[0].Code == codes.Aborted)

	other := d.call(conn, d.key(1), "book", 99)
	step("the first key with another order: refused, never retried", d.key(1), "book", 99, other,
		grpcidem.Reason(other.err) == grpcidem.ReasonMismatch && len(other.attempts) == 1)
	return errors.Join(errs...)
}
