// Package democlient is the scripted client that the examples' -demo
// flag runs against them (examples/nethttp, gin, echo and postgres; the
// transcript in the README is what Play prints), and the hook that lets it
// show a double click without guessing timings (Clicks). It is not part of
// the kit: a service copied from an example drops the calls to Clicks.
package democlient

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem"
)

// Clicks holds a request whose query has slow=1 in its handler until
// idem has turned away a duplicate of it (the same Idempotency-Key) with
// 409, or for 10 seconds: the demo's double click then shows the 409 on any
// machine, however loaded (the duplicate, sent at the same time, comes
// long before). Other requests pass at once.
type Clicks struct {
	mu      sync.Mutex
	pending map[string]chan struct{} // by key; closed once a duplicate got 409
}

func NewClicks() *Clicks {
	return &Clicks{pending: make(map[string]chan struct{})}
}

// of returns the channel of key's double click, made on first use; d.mu is
// held.
func (d *Clicks) of(key string) chan struct{} {
	ch, ok := d.pending[key]
	if !ok {
		ch = make(chan struct{})
		d.pending[key] = ch
	}
	return ch
}

// Hold is called by the handler: it waits while r is the first of a double
// click.
func (d *Clicks) Hold(r *http.Request) {
	if d == nil || r.URL.Query().Get("slow") == "" {
		return
	}
	key := r.Header.Get("Idempotency-Key")
	d.mu.Lock()
	ch := d.of(key) // the 409 may have come first: then ch is closed
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		if d.pending[key] == ch {
			delete(d.pending, key)
		}
		d.mu.Unlock()
	}()
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	case <-r.Context().Done():
	}
}

// WriteError is idem's error writer: idem.WriteProblem, the default, and
// for the 409 of a slow=1 duplicate it lets the first request go on.
func (d *Clicks) WriteError(w http.ResponseWriter, r *http.Request, err *idem.Error) {
	if d != nil && errors.Is(err, idem.ErrConflict) && r.URL.Query().Get("slow") != "" {
		d.mu.Lock()
		ch := d.of(r.Header.Get("Idempotency-Key"))
		select {
		case <-ch:
		default:
			close(ch)
		}
		d.mu.Unlock()
	}
	idem.WriteProblem(w, r, err)
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

// Play runs the scripted client against base ("http://host:port") and
// writes a curl-like transcript to out: a first call, its retry (replayed:
// the handler does not run again), the same key with another body (422),
// and a double click while the first request still runs (one 201, one
// 409). The keys are order-1-RUN and order-2-RUN, run telling them from
// those of other runs. It returns an error for every answer that is not
// the promised one.
func Play(out io.Writer, base, run string) error {
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
	// key first runs (held by Clicks until the other was turned
	// away); the other gets 409.
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
		first, second = second, first // the 409 first, whichever came back first
	}
	click.title, click.status = "a double click while the first request is still running: conflict", http.StatusConflict
	check(click, first.a, first.err)
	click.title, click.status = "the first request of the double click completes", http.StatusCreated
	check(click, second.a, second.err)
	return errors.Join(errs...)
}

// RunID returns 8 random hex digits: a run's keys differ from every other
// run's, so runs can follow one another against one Redis.
func RunID() string {
	var b [4]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
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

// Burst sends n identical requests at once, with one key and one body (a
// client's retries racing each other, or n copies of one job), writes to
// out the answer of the request the handler ran for and how many of each
// answer came back, and returns an error unless the handler ran for exactly
// one of them (201 without Idempotent-Replayed) and each other got either
// 409 (the first was still in flight) or a replay of it: the same status,
// Location and body, byte for byte.
func Burst(out io.Writer, base, key, body string, n int) error {
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
