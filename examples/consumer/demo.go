package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idemkit/idem"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/redis/go-redis/v9"
)

// The demo's figures: 8 payments, the 3rd and the 6th sent twice, so 10
// entries; alice reads 4 of them and crashes after Do of her 2nd.
const (
	demoPayments = 8
	demoBatch    = 4
	demoCrashAt  = 2
	// demoMinIdle is short, so that the others claim alice's entries
	// soon. The lease is longer: it matters only for a consumer that dies
	// holding a key, which alice does not (she dies after Do).
	demoMinIdle = 500 * time.Millisecond
	demoLease   = 2 * time.Second
)

func demoTwice(n int) bool { return n == 3 || n == 6 }

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
	run := randomHex(4)
	stream, group, prefix := "demo-payments-"+run, "ledger", "pay-"+run
	rdb := newClient(addr)
	defer rdb.Close()
	defer rdb.Del(context.WithoutCancel(ctx), append(ledgerOf(stream).keys(), stream)...)

	fmt.Fprintf(out, "demo on %s: stream %s, group %s; key of Do: the payment id\n\n", where, stream, group)
	entries, err := produce(ctx, rdb, stream, prefix, demoPayments, demoTwice)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "producer: %d payments in %d entries (%s and %s sent twice: a producer retrying an XADD)\n\n",
		demoPayments, entries, paymentN(prefix, 3).id, paymentN(prefix, 6).id)

	var (
		mu       sync.Mutex
		acked    = map[string]bool{}
		counts   = map[string]int{}
		allAcked = make(chan struct{})
	)
	report := func(r outcome) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintln(out, "  "+r.String())
		counts[r.what]++
		if r.e.via == "claim" {
			counts["claimed"]++
		}
		if r.acked && !acked[r.e.id] {
			acked[r.e.id] = true
			if len(acked) == entries {
				close(allAcked)
			}
		}
	}
	// Each consumer has a client and a middleware of its own, as separate
	// processes would.
	var closers []func()
	defer func() {
		for _, c := range closers {
			c()
		}
	}()
	newWorker := func(name string, count int64, minIdle time.Duration) (*worker, error) {
		c := newClient(addr)
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
		return &worker{rdb: c, m: m, stream: stream, group: group, name: name,
			minIdle: minIdle, block: 50 * time.Millisecond, count: count, report: report}, nil
	}

	alice, err := newWorker("alice", demoBatch, time.Hour)
	if err != nil {
		return err
	}
	dos := 0
	alice.hold = func(_ context.Context, point string, _ entry) error {
		if point == pointAfterDo {
			if dos++; dos == demoCrashAt {
				return errStop
			}
		}
		return nil
	}
	fmt.Fprintf(out, "alice reads %d entries, credits %d payments and crashes after Do of the last, before its XACK:\n", demoBatch, demoCrashAt)
	if err := alice.run(ctx); !errors.Is(err, errStop) {
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
	case <-allAcked:
	case <-ctx.Done():
	}
	stop()
	wg.Wait()

	mu.Lock()
	fmt.Fprintf(out, "\n%d entries acked: %d credits, %d replays; %d deliveries by XAUTOCLAIM, %d ErrConflict (left pending, claimed again)\n",
		len(acked), counts["applied"], counts["replayed"], counts["claimed"], counts["conflict"])
	mu.Unlock()
	return printLedger(ctx, out, rdb, stream, group, prefix, entries)
}

// printLedger prints, for each payment of the demo, how many entries
// carried it and how many times it was credited, and each account's
// balance against the sum of its payments. It returns an error unless
// every payment was credited once, every balance is right and no entry
// is pending.
func printLedger(ctx context.Context, out io.Writer, rdb *redis.Client, stream, group, prefix string, entries int) error {
	l := ledgerOf(stream)
	applied, err := rdb.HGetAll(ctx, l.applied).Result()
	if err != nil {
		return err
	}
	by, err := rdb.HGetAll(ctx, l.by).Result()
	if err != nil {
		return err
	}
	balances, err := rdb.HGetAll(ctx, l.balances).Result()
	if err != nil {
		return err
	}
	pending, err := rdb.XPending(ctx, stream, group).Result()
	if err != nil {
		return err
	}
	var wrong []string
	want := map[string]int64{}
	fmt.Fprintf(out, "\nledger (%s: credits per payment):\n", l.applied)
	fmt.Fprintf(out, "  %-20s %-8s %8s %8s %9s  %s\n", "payment", "account", "amount", "entries", "credited", "by")
	for n := 1; n <= demoPayments; n++ {
		p := paymentN(prefix, n)
		want[p.account] += p.amount
		sent := 1
		if demoTwice(n) {
			sent = 2
		}
		fmt.Fprintf(out, "  %-20s %-8s %8s %8d %9s  %s\n", p.id, p.account, cents(p.amount), sent, applied[p.id], by[p.id])
		if applied[p.id] != "1" {
			wrong = append(wrong, fmt.Sprintf("%s credited %q times", p.id, applied[p.id]))
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
