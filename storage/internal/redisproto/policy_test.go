package redisproto

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/leakcheck"
	"github.com/idemkit/idem/internal/testclock"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

// asker is an Ask whose answers a test gives one by one: each call
// blocks until the test sends the answer on next.
type asker struct {
	calls atomic.Int32
	next  chan answer
}

type answer struct {
	refusal error
	ok      bool
}

func newAsker() *asker { return &asker{next: make(chan answer)} }

func (a *asker) ask(ctx context.Context) (error, bool) {
	a.calls.Add(1)
	select {
	case r := <-a.next:
		return r.refusal, r.ok
	case <-ctx.Done():
		return nil, false
	}
}

var refused = &policyError{policy: "allkeys-lru", pkg: "redisstore"}

// TestGuard walks a guard through its verdicts: the first use waits for a
// check, a fresh verdict costs none, a stale one is answered at once
// while one check runs in the background, a failed check keeps the old
// verdict.
func TestGuard(t *testing.T) {
	a := newAsker()
	clock := testclock.New(time.Unix(1_000_000, 0))
	g := &Guard{Ask: a.ask, Now: clock.Now}
	ctx := t.Context()

	// First use: waits for the check, which refuses.
	errc := make(chan error)
	go func() { errc <- g.Check(ctx) }()
	go func() { errc <- g.Check(ctx) }() // waits for the same check
	a.next <- answer{refused, true}
	for range 2 {
		if err := <-errc; !errors.Is(err, ErrEvictionPolicy) {
			t.Fatalf("first use: %v, want ErrEvictionPolicy", err)
		}
	}
	if n := a.calls.Load(); n != 1 {
		t.Fatalf("%d checks for two operations at first use, want 1", n)
	}
	// Fresh: no check.
	clock.Advance(CheckEvery - time.Second)
	if err := g.Check(ctx); !errors.Is(err, ErrEvictionPolicy) || a.calls.Load() != 1 {
		t.Fatalf("fresh verdict: %v after %d checks, want ErrEvictionPolicy after 1", err, a.calls.Load())
	}
	// Stale: the old verdict at once, one check in the background.
	clock.Advance(time.Second)
	if err := g.Check(ctx); !errors.Is(err, ErrEvictionPolicy) {
		t.Fatalf("stale verdict: %v, want the old one", err)
	}
	if err := g.Check(ctx); !errors.Is(err, ErrEvictionPolicy) {
		t.Fatalf("stale verdict, check running: %v, want the old one", err)
	}
	running := g.Running()
	if running == nil {
		t.Fatal("no check running after a stale verdict")
	}
	a.next <- answer{nil, false} // the check fails: no verdict
	<-running
	if err := g.Check(ctx); !errors.Is(err, ErrEvictionPolicy) {
		t.Fatalf("after a failed check: %v, want the old verdict", err)
	}
	running = g.Running()
	a.next <- answer{nil, true} // the policy was fixed
	<-running
	if err := g.Check(ctx); err != nil {
		t.Fatalf("after a check that allows: %v", err)
	}
	if n := a.calls.Load(); n != 3 {
		t.Fatalf("%d checks, want 3", n)
	}
}

// TestGuardFirstUse: before any verdict, an operation whose context ends
// gives up with its context's error; one whose check fails goes on.
func TestGuardFirstUse(t *testing.T) {
	a := newAsker()
	g := &Guard{Ask: a.ask}
	ctx, cancel := context.WithCancelCause(t.Context())
	cause := errors.New("client went away")
	errc := make(chan error)
	go func() { errc <- g.Check(ctx) }()
	waitRunning(g)
	cancel(cause)
	if err := <-errc; !errors.Is(err, cause) {
		t.Fatalf("canceled while waiting: %v, want its cause", err)
	}
	// The check goes on without the operation that started it, and fails.
	running := g.Running()
	a.next <- answer{nil, false}
	<-running
	// The next operation starts another; it fails too, and the operation
	// goes on.
	go func() { errc <- g.Check(t.Context()) }()
	waitRunning(g)
	a.next <- answer{nil, false}
	if err := <-errc; err != nil {
		t.Fatalf("after a failed first check: %v, want nil (the operation goes on)", err)
	}
	if g.verdict.Load() != nil {
		t.Fatal("a failed check gave a verdict")
	}
	// Off: no check at all.
	off := &Guard{Ask: a.ask, Off: true}
	if err := off.Check(t.Context()); err != nil || off.Running() != nil {
		t.Fatalf("guard off: %v, running %v", err, off.Running())
	}
}

// waitRunning waits for a check to start on another goroutine.
func waitRunning(g *Guard) {
	for g.Running() == nil {
		time.Sleep(time.Millisecond)
	}
}

func TestTally(t *testing.T) {
	down := errors.New("connection refused")
	for _, c := range []struct {
		name    string
		add     func(*Tally)
		listErr error
		refuses bool
		ok      bool
	}{
		{"noeviction", func(t *Tally) { t.Add("noeviction", "", nil) }, nil, false, true},
		{"silent", func(t *Tally) { t.Add("", "", nil) }, nil, false, true},
		{"evicts", func(t *Tally) { t.Add("volatile-lru", "", nil) }, nil, true, true},
		{"one master evicts, one down", func(t *Tally) {
			t.Add("", "master a", down)
			t.Add("allkeys-lru", "master b", nil)
		}, nil, true, true},
		{"one master down", func(t *Tally) {
			t.Add("noeviction", "master a", nil)
			t.Add("", "master b", down)
		}, nil, false, false},
		{"nobody asked", func(*Tally) {}, nil, false, false},
		{"layout unknown", func(t *Tally) { t.Add("noeviction", "master a", nil) }, down, false, false},
	} {
		tl := &Tally{Pkg: "rueidisstore"}
		c.add(tl)
		refusal, ok := tl.Verdict(c.listErr)
		if (refusal != nil) != c.refuses || ok != c.ok {
			t.Errorf("%s: verdict %v, %v; want refusal %v, ok %v", c.name, refusal, ok, c.refuses, c.ok)
		}
		if refusal != nil && (!errors.Is(refusal, ErrEvictionPolicy) || !strings.Contains(refusal.Error(), "rueidisstore.WithEvictionAllowed")) {
			t.Errorf("%s: refusal %q: want ErrEvictionPolicy naming the store's opt-out", c.name, refusal)
		}
	}
	tl := &Tally{Pkg: "redisstore"}
	tl.Add("allkeys-lfu", "master 10.0.0.1:7000", nil)
	if refusal, _ := tl.Verdict(nil); !strings.Contains(refusal.Error(), "allkeys-lfu on master 10.0.0.1:7000") {
		t.Errorf("refusal %q does not name the policy and the node", refusal)
	}
}

func TestTransient(t *testing.T) {
	for msg, want := range map[string]bool{
		"LOADING Redis is loading the dataset in memory": true,
		"ERR LOADING x":                                true,
		"BUSY Redis is busy running a script":          true,
		"TRYAGAIN Multiple keys request during rehash": true,
		"MASTERDOWN Link with MASTER is down":          true,
		"CLUSTERDOWN The cluster is down":              true,
		"NOPERM this user has no permissions":          false,
		"ERR unknown command 'INFO'":                   false,
		"ERR BUSY":                                     true,
	} {
		if got := Transient(msg); got != want {
			t.Errorf("Transient(%q) = %v, want %v", msg, got, want)
		}
	}
}

func TestCursor(t *testing.T) {
	c := Cursor{Node: "10.0.0.1:7000", Scan: 42, Keys: []string{"idem:a", "idem:b"}}
	got, err := ParseCursor(c.String())
	if err != nil || got.Node != c.Node || got.Scan != c.Scan || strings.Join(got.Keys, ",") != "idem:a,idem:b" {
		t.Fatalf("round trip: %+v, %v; want %+v", got, err, c)
	}
	if got, err := ParseCursor(""); err != nil || got.Node != "" || got.Keys != nil {
		t.Fatalf(`ParseCursor(""): %+v, %v; want the start`, got, err)
	}
	for _, bad := range []string{"x", "e30", "!!", Cursor{}.String()} {
		if _, err := ParseCursor(bad); err == nil || !strings.Contains(err.Error(), "not made by this store") {
			t.Errorf("ParseCursor(%q): %v, want an invalid cursor", bad, err)
		}
	}
	for prefix, want := range map[string]string{"idem:": "idem:*", "": "*", `a*b?[c]\`: `a\*b\?\[c\]\\*`} {
		if got := Match(prefix); got != want {
			t.Errorf("Match(%q) = %q, want %q", prefix, got, want)
		}
	}
}
