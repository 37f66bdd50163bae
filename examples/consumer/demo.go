package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idemkit/idem"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/redis/go-redis/v9"
)

// The demo's figures: 8 payments, the 3rd and the 6th sent twice, so 10
// entries; alice reads 4 of them and crashes at the XACK of her 2nd.
const (
	demoPayments = 8
	demoBatch    = 4
	demoCrashAt  = 2
	// demoMinIdle is short, so that the others claim alice's entries
	// soon. The lease matters only for a consumer that dies holding a
	// payment, which alice does not (she dies after Do).
	demoMinIdle = 500 * time.Millisecond
	demoLease   = 2 * time.Second
)

func demoTwice(n int) bool { return n == 3 || n == 6 }

// demoPayment is the n-th payment (from 1) of the run named prefix.
func demoPayment(prefix string, n int) payment {
	return payment{id: fmt.Sprintf("%s-%05d", prefix, n), account: "acct-" + strconv.Itoa(1+n%3), amount: int64(500 + (n*739)%4500)}
}

// runDemo plays a producer and three consumers on one stream, on the
// Redis at addr, or on an in-process miniredis when addr is "": alice
// crashes after Do credited a payment and before its XACK, with more
// entries pending; bob and carol claim them and process the rest. It
// prints each entry's outcome and the ledger, and returns an error unless
// every payment was credited exactly once and every entry acked. Each run
// has a stream and payment ids of its own; it deletes the stream and the
// ledger at the end (idem's records expire).
func runDemo(addr string, out io.Writer) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	where := "Redis at " + addr
	if addr == "" {
		mr := miniredis.NewMiniRedis()
		if err := mr.Start(); err != nil {
			return err
		}
		defer mr.Close()
		addr, where = mr.Addr(), "an in-process miniredis"
	}
	run := strings.ToLower(rand.Text()[:8])
	stream, group, prefix := "demo-payments-"+run, "ledger", "pay-"+run
	rdb := redis.NewClient(redisstore.ClientOptions(addr))
	defer rdb.Close()
	defer rdb.Del(context.WithoutCancel(ctx), append(ledgerKeys(stream), stream)...)

	fmt.Fprintf(out, "demo on %s: stream %s, group %s; key of Do: the payment id\n\n", where, stream, group)
	entries := 0
	for n := 1; n <= demoPayments; n++ {
		p, times := demoPayment(prefix, n), 1
		if demoTwice(n) {
			times = 2
		}
		for range times {
			err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"id", p.id, "account", p.account, "amount", p.amount}}).Err()
			if err != nil {
				return err
			}
			entries++
		}
	}
	fmt.Fprintf(out, "producer: %d payments in %d entries (%s and %s sent twice: a producer retrying an XADD)\n\n",
		demoPayments, entries, demoPayment(prefix, 3).id, demoPayment(prefix, 6).id)

	// Each consumer has a client and a middleware of its own, as separate
	// processes would, and logs through t.
	t := newTally(out, entries)
	var closers []func()
	defer func() {
		for _, c := range closers {
			c()
		}
	}()
	newWorker := func(name string, count int64, minIdle time.Duration, hooks ...redis.Hook) (*worker, error) {
		c := redis.NewClient(redisstore.ClientOptions(addr))
		for _, h := range hooks {
			c.AddHook(h)
		}
		m, err := idem.New(redisstore.New(c), idem.WithLease(demoLease), idem.WithTTL(time.Hour))
		if err != nil {
			c.Close()
			return nil, err
		}
		closers = append(closers, func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			m.Shutdown(sctx)
			c.Close()
		})
		return &worker{rdb: c, m: m, log: slog.New(t).With("consumer", name), stream: stream, group: group,
			name: name, minIdle: minIdle, block: 50 * time.Millisecond, count: count}, nil
	}

	actx, crashed := context.WithCancel(ctx)
	defer crashed()
	alice, err := newWorker("alice", demoBatch, time.Hour, &crash{at: demoCrashAt, cancel: crashed})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "alice reads %d entries, credits %d payments and crashes after Do of the last, at its XACK (the demo cuts her client off there):\n", demoBatch, demoCrashAt)
	if err := alice.run(actx); !errors.Is(err, context.Canceled) || ctx.Err() != nil {
		return fmt.Errorf("alice: %v, want a crash", err)
	}
	pending, err := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: stream, Group: group, Start: "-", End: "+", Count: 100, Consumer: "alice"}).Result()
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "alice is gone; XPENDING: %d entries pending with her:", len(pending))
	for _, p := range pending {
		fmt.Fprintf(out, " %s", p.ID)
	}
	fmt.Fprintf(out, "\n\nbob and carol join; XAUTOCLAIM hands them what has been pending for %v:\n", demoMinIdle)
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, name := range []string{"bob", "carol"} {
		w, err := newWorker(name, 2, demoMinIdle)
		if err != nil {
			stop()
			wg.Wait()
			return err
		}
		wg.Go(func() { w.run(wctx) })
	}
	select {
	case <-t.allAcked:
	case <-ctx.Done():
	}
	stop()
	wg.Wait()

	t.mu.Lock()
	fmt.Fprintf(out, "\n%d entries acked: %d credits, %d replays; %d deliveries by XAUTOCLAIM, %d ErrConflict (left pending, claimed again)\n",
		len(t.acked), t.counts["applied"], t.counts["replayed"], t.counts["claim"], t.counts["conflict"])
	t.mu.Unlock()
	return printLedger(ctx, out, rdb, stream, group, prefix, entries)
}

// crash is a go-redis hook that plays the crash of the consumer whose
// client it is in: at the client's at-th XACK it cancels the consumer's
// context (cancel), and from then on every command fails without being
// sent, that XACK first.
type crash struct {
	at     int32
	cancel context.CancelFunc
	xacks  atomic.Int32
	dead   atomic.Bool
}

var errCrashed = errors.New("crashed: the command was not sent")

func (c *crash) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *crash) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "xack" && c.xacks.Add(1) == c.at {
			c.dead.Store(true)
			c.cancel()
		}
		if c.dead.Load() {
			return errCrashed
		}
		return next(ctx, cmd)
	}
}

func (c *crash) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if c.dead.Load() {
			for _, cmd := range cmds {
				cmd.SetErr(errCrashed)
			}
			return errCrashed
		}
		return next(ctx, cmds)
	}
}

// tally is the demo consumers' slog.Handler: it prints the records
// (without time, level and message) and counts the entries' outcomes, and
// closes allAcked once every entry of the stream is acked.
type tally struct {
	slog.Handler
	*counter
}

// counter is what a tally counts; its handlers share it.
type counter struct {
	mu       sync.Mutex
	entries  int
	acked    map[string]bool
	counts   map[string]int // per outcome, and "claim": deliveries by XAUTOCLAIM
	allAcked chan struct{}
}

func newTally(out io.Writer, entries int) tally {
	drop := func(groups []string, a slog.Attr) slog.Attr {
		if len(groups) == 0 && (a.Key == slog.TimeKey || a.Key == slog.LevelKey || a.Key == slog.MessageKey) {
			return slog.Attr{}
		}
		return a
	}
	return tally{slog.NewTextHandler(out, &slog.HandlerOptions{ReplaceAttr: drop}),
		&counter{entries: entries, acked: map[string]bool{}, counts: map[string]int{}, allAcked: make(chan struct{})}}
}

func (t tally) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "entry" {
		var id string
		var acked bool
		t.mu.Lock()
		r.Attrs(func(a slog.Attr) bool {
			switch a.Key {
			case "entry":
				id = a.Value.String()
			case "outcome":
				t.counts[a.Value.String()]++
			case "via":
				t.counts[a.Value.String()]++
			case "acked":
				acked = a.Value.Bool()
			}
			return true
		})
		if acked && !t.acked[id] {
			if t.acked[id] = true; len(t.acked) == t.entries {
				close(t.allAcked)
			}
		}
		t.mu.Unlock()
	}
	return t.Handler.Handle(ctx, r)
}

func (t tally) WithAttrs(as []slog.Attr) slog.Handler {
	return tally{t.Handler.WithAttrs(as), t.counter}
}

func (t tally) WithGroup(name string) slog.Handler {
	return tally{t.Handler.WithGroup(name), t.counter}
}

// printLedger prints, for each payment of the demo, how many entries
// carried it and how many times it was credited, and each account's
// balance against the sum of its payments. It returns an error unless
// every payment was credited once, every balance is right and no entry
// is pending.
func printLedger(ctx context.Context, out io.Writer, rdb *redis.Client, stream, group, prefix string, entries int) error {
	keys := ledgerKeys(stream)
	credits, err := rdb.HGetAll(ctx, keys[0]).Result()
	if err != nil {
		return err
	}
	balances, err := rdb.HGetAll(ctx, keys[1]).Result()
	if err != nil {
		return err
	}
	pending, err := rdb.XPending(ctx, stream, group).Result()
	if err != nil {
		return err
	}
	times, by := map[string]int{}, map[string][]string{}
	for field, consumer := range credits { // "<payment id> <execution>" -> consumer
		id, _, _ := strings.Cut(field, " ")
		times[id]++
		by[id] = append(by[id], consumer)
		slices.Sort(by[id])
	}
	var wrong []string
	want := map[string]int64{}
	fmt.Fprintf(out, "\nledger (%s: a field per credit):\n", keys[0])
	fmt.Fprintf(out, "  %-20s %-8s %8s %8s %9s  %s\n", "payment", "account", "amount", "entries", "credited", "by")
	for n := 1; n <= demoPayments; n++ {
		p := demoPayment(prefix, n)
		want[p.account] += p.amount
		sent := 1
		if demoTwice(n) {
			sent = 2
		}
		fmt.Fprintf(out, "  %-20s %-8s %8s %8d %9d  %s\n", p.id, p.account, cents(p.amount), sent, times[p.id], strings.Join(by[p.id], ","))
		if times[p.id] != 1 {
			wrong = append(wrong, fmt.Sprintf("%s credited %d times", p.id, times[p.id]))
		}
	}
	fmt.Fprintln(out, "balances:")
	for _, a := range []string{"acct-1", "acct-2", "acct-3"} {
		got, _ := strconv.ParseInt(balances[a], 10, 64)
		verdict := "ok"
		if got != want[a] {
			verdict = "WRONG"
			wrong = append(wrong, fmt.Sprintf("%s balance %s, want %s", a, cents(got), cents(want[a])))
		}
		fmt.Fprintf(out, "  %-8s %8s (sum of its payments %s) %s\n", a, cents(got), cents(want[a]), verdict)
	}
	if pending.Count != 0 {
		wrong = append(wrong, fmt.Sprintf("%d entries still pending", pending.Count))
	}
	if len(wrong) > 0 {
		fmt.Fprintf(out, "FAILED: %v\n", wrong)
		return fmt.Errorf("demo: %d payments in %d entries: %v", demoPayments, entries, wrong)
	}
	fmt.Fprintf(out, "every payment credited exactly once; all %d entries acked, none pending\n", entries)
	return nil
}

// cents formats an amount in cents.
func cents(c int64) string { return fmt.Sprintf("%d.%02d", c/100, c%100) }
