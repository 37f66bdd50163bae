//go:build unix

package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// The tests in this file run the consumer as real processes (built once,
// without -race) on a real redis-server (internal/redistest: skipped
// without one, failed when IDEM_REQUIRE_REDIS=1), kill them with SIGKILL
// or stop them with SIGTERM, and count the credits in Redis.
//
// IDEM_CONSUMER_FLAGS adds flags to every consumer process: with
// "-unprotected" the consumers credit without idem, and
// TestKillBeforeEffect and TestKillAfterDo must fail.

// The figures of the kill tests: 300 payments, every tenth sent twice
// (330 entries), three consumers reading 10 entries at a time; the victim
// credits 3 payments, then is held at the 4th with 7 entries pending.
const (
	killPayments = 300
	killBatch    = 10
	killPass     = 3
)

// TestKillBeforeEffect kills a consumer held inside the credit, with the
// payment's key held (its heartbeat renewing the lease) and its batch
// pending. While it lives, a survivor that claims the entry gets
// ErrConflict and leaves it pending; once it is killed and its lease
// lapses, a survivor claims the entry again and credits the payment. Every
// payment is credited once, every entry acked.
func TestKillBeforeEffect(t *testing.T) { testKill(t, pointBeforeEffect) }

// TestKillAfterDo kills a consumer after Do credited a payment and stored
// its result, before the XACK: a survivor claims the entry, Do replays the
// victim's result without crediting again, and the survivor acks it.
func TestKillAfterDo(t *testing.T) { testKill(t, pointAfterDo) }

func testKill(t *testing.T, point string) {
	addr := redistest.Addr(t)
	rdb := newTestClient(addr)
	defer rdb.Close()
	ctx := t.Context()
	stream := "kill-" + point + "-" + randomHex(4)
	dropAtEnd(t, addr, stream)
	flags := consumerFlags(addr, stream)
	entries := produceProc(t, addr, stream, killPayments)

	pauseFile := filepath.Join(t.TempDir(), "paused")
	victim := startConsumer(t, "victim", append(flags, "-consumer", "victim", "-pause-at", point,
		"-pause-after", strconv.Itoa(killPass), "-pause-file", pauseFile)...)
	heldEntry, heldPayment := waitPause(t, victim, pauseFile)
	held := pendingOf(t, rdb, stream, "victim")
	if len(held) != killBatch-killPass || !slices.Contains(held, heldEntry) {
		t.Fatalf("victim held at %s (%s): pending %v, want %d entries with it", heldEntry, heldPayment, held, killBatch-killPass)
	}
	survivors := []*proc{
		startConsumer(t, "s1", append(flags, "-consumer", "s1")...),
		startConsumer(t, "s2", append(flags, "-consumer", "s2")...),
	}
	if point == pointBeforeEffect {
		// The victim lives and holds the key: a claim of its entry in
		// hand (idle past -min-idle) gets ErrConflict, and no XACK.
		conflict := func() bool {
			for _, s := range survivors {
				for _, l := range logLines(s.output()) {
					if l.entry == heldEntry && l.outcome == "conflict" && !l.acked {
						return true
					}
				}
			}
			return false
		}
		if !poll(15*time.Second, conflict) {
			t.Errorf("no survivor claimed %s and got ErrConflict while the victim held its key", heldEntry)
		}
	}
	victim.kill()
	killed := time.Now()
	settled := poll(60*time.Second, func() bool { return allAcked(ctx, rdb, stream) })
	took := time.Since(killed)
	var lines []logLine
	for _, s := range survivors {
		if err := s.stop(10 * time.Second); err != nil || !strings.Contains(s.output(), "shutdown: records stored") {
			t.Errorf("%s after SIGTERM: %v\n%s", s.name, err, s.output())
		}
		lines = append(lines, logLines(s.output())...)
	}
	if !settled {
		p, _ := rdb.XPending(ctx, stream, "ledger").Result()
		t.Fatalf("entries still pending or undelivered 60s after the kill: XPENDING %+v", p)
	}

	credits := checkLedger(t, rdb, stream, entries)

	// The victim's entries were claimed by the survivors, and acked there.
	var claims, conflicts, replays int
	for _, l := range lines {
		if l.via == "claim" {
			claims++
		}
		switch l.outcome {
		case "conflict":
			conflicts++
		case "replayed":
			replays++
		}
	}
	for _, id := range held {
		if !slices.ContainsFunc(lines, func(l logLine) bool { return l.entry == id && l.via == "claim" && l.acked }) {
			t.Errorf("the victim's entry %s was not claimed and acked by a survivor", id)
		}
	}
	by, err := rdb.HGet(ctx, ledgerOf(stream).by, heldPayment).Result()
	if err != nil {
		t.Fatal(err)
	}
	switch point {
	case pointBeforeEffect:
		if by == "victim" {
			t.Errorf("%s was credited by the victim, held before its credit and killed", heldPayment)
		}
	case pointAfterDo:
		if by != "victim" {
			t.Errorf("%s was credited by %s, want the victim (held after Do)", heldPayment, by)
		}
		if !slices.ContainsFunc(lines, func(l logLine) bool {
			return l.entry == heldEntry && l.via == "claim" && l.outcome == "replayed" && l.by == "victim" && l.acked
		}) {
			t.Errorf("no survivor replayed the victim's result for %s and acked it", heldEntry)
		}
	}
	t.Logf("%d payments in %d entries, 3 consumers; victim killed (SIGKILL) at %s on %s with %d entries pending; "+
		"survivors: %d deliveries by XAUTOCLAIM, %d ErrConflict, %d replays; %d credits counted for %d payments; all acked %v after the kill",
		killPayments, entries, point, heldPayment, len(held), claims, conflicts, replays, credits, killPayments, took.Round(time.Millisecond))
}

// TestStopFinishesEntryInHand stops (SIGTERM) a consumer held inside a
// credit: it finishes that entry (credit and XACK), leaves the rest of its
// batch pending, and exits 0 once its records are stored. Started again
// under the same name, it reads those entries back first, and every
// payment is credited once.
func TestStopFinishesEntryInHand(t *testing.T) {
	addr := redistest.Addr(t)
	rdb := newTestClient(addr)
	defer rdb.Close()
	ctx := t.Context()
	stream := "stop-" + randomHex(4)
	dropAtEnd(t, addr, stream)
	flags := append(consumerFlags(addr, stream), "-consumer", "c1")
	entries := produceProc(t, addr, stream, 30)
	pauseFile := filepath.Join(t.TempDir(), "paused")
	c := startConsumer(t, "c1", append(flags, "-pause-at", pointBeforeEffect, "-pause-after", "2", "-pause-file", pauseFile)...)
	heldEntry, heldPayment := waitPause(t, c, pauseFile)
	if err := c.stop(10 * time.Second); err != nil {
		t.Fatalf("after SIGTERM: %v\n%s", err, c.output())
	}
	if !slices.ContainsFunc(logLines(c.output()), func(l logLine) bool {
		return l.entry == heldEntry && l.outcome == "applied" && l.acked
	}) || !strings.Contains(c.output(), "shutdown: records stored") {
		t.Errorf("the entry in hand %s was not finished before the exit:\n%s", heldEntry, c.output())
	}
	left := pendingOf(t, rdb, stream, "c1")
	if len(left) != killBatch-3 {
		t.Errorf("pending after the stop: %v, want the %d entries after the one in hand", left, killBatch-3)
	}
	if n, _ := rdb.HLen(ctx, ledgerOf(stream).applied).Result(); n != 3 {
		t.Errorf("%d payments credited before the stop, want 3 (the last %s)", n, heldPayment)
	}

	again := startConsumer(t, "c1-again", flags...)
	if !poll(30*time.Second, func() bool { return allAcked(ctx, rdb, stream) }) {
		t.Fatalf("not all acked after the restart:\n%s", again.output())
	}
	if err := again.stop(10 * time.Second); err != nil {
		t.Errorf("after SIGTERM: %v\n%s", err, again.output())
	}
	var history []string
	for _, l := range logLines(again.output()) {
		if l.via == "history" {
			history = append(history, l.entry)
		}
	}
	if !slices.Equal(history, left) {
		t.Errorf("read back %v, want its pending entries %v", history, left)
	}
	checkLedger(t, rdb, stream, entries)
}

// dropAtEnd deletes the stream and its ledger when the test ends (the
// Redis may be IDEM_REDIS_ADDR's, shared); idem's records expire.
func dropAtEnd(t *testing.T, addr, stream string) {
	t.Cleanup(func() {
		rdb := newTestClient(addr)
		defer rdb.Close()
		rdb.Del(context.Background(), append(ledgerOf(stream).keys(), stream)...)
	})
}

// consumerFlags are the flags of every consumer of the tests: short
// min-idle and lease, so that claims come quickly; then those of
// IDEM_CONSUMER_FLAGS.
func consumerFlags(addr, stream string) []string {
	f := []string{"-redis", addr, "-stream", stream, "-group", "ledger", "-min-idle", "1s", "-lease", "1s",
		"-block", "100ms", "-count", strconv.Itoa(killBatch)}
	return append(f, strings.Fields(os.Getenv("IDEM_CONSUMER_FLAGS"))...)
}

// produceProc adds n payments to stream with the command's -produce and
// returns the number of entries it added.
func produceProc(t *testing.T, addr, stream string, n int) int {
	t.Helper()
	cmd := exec.Command(consumerBinary(t), "-redis", addr, "-stream", stream, "-produce", strconv.Itoa(n))
	cmd.SysProcAttr = sysProcAttr()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("-produce: %v\n%s", err, out)
	}
	want := n + n/10
	if !strings.HasPrefix(string(out), fmt.Sprintf("produced %d payments in %d entries", n, want)) {
		t.Fatalf("-produce said: %s", out)
	}
	return want
}

// proc is a consumer process.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  string // its stdout and stderr
	once sync.Once
	err  error // Wait's
}

// startConsumer starts the consumer with args; it is killed, and waited
// for, when the test ends.
func startConsumer(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, out: filepath.Join(t.TempDir(), name+".log"), cmd: exec.Command(consumerBinary(t), args...)}
	f, err := os.Create(p.out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p.cmd.Stdout, p.cmd.Stderr = f, f
	p.cmd.SysProcAttr = sysProcAttr()
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.kill)
	return p
}

// kill kills the process with SIGKILL and waits for it; it may be called
// again.
func (p *proc) kill() {
	p.once.Do(func() {
		p.cmd.Process.Kill()
		p.err = p.cmd.Wait()
	})
}

// stop sends SIGTERM and waits for the exit; after timeout it kills the
// process. It returns Wait's error (nil: exit status 0).
func (p *proc) stop(timeout time.Duration) error {
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	timer := time.AfterFunc(timeout, func() { p.cmd.Process.Kill() })
	defer timer.Stop()
	p.once.Do(func() { p.err = p.cmd.Wait() })
	if !timer.Stop() {
		return fmt.Errorf("no exit within %v of SIGTERM: killed (%v)", timeout, p.err)
	}
	return p.err
}

// output returns what the process printed so far.
func (p *proc) output() string {
	b, _ := os.ReadFile(p.out)
	return string(b)
}

// waitPause waits until p is held at its -pause-at point and returns the
// entry and the payment it holds.
func waitPause(t *testing.T, p *proc, file string) (entry, payment string) {
	t.Helper()
	var b []byte
	if !poll(30*time.Second, func() bool {
		var err error
		b, err = os.ReadFile(file)
		return err == nil
	}) {
		t.Fatalf("%s not held after 30s:\n%s", p.name, p.output())
	}
	entry, payment, _ = strings.Cut(strings.TrimSpace(string(b)), " ")
	return entry, payment
}

// poll calls cond until it reports true, for up to timeout, and returns
// its last answer. The conditions are another process's doing: there is
// nothing to wait on but time.
func poll(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// pendingOf returns the ids of the entries pending with consumer.
func pendingOf(t *testing.T, rdb *redis.Client, stream, consumer string) []string {
	t.Helper()
	p, err := rdb.XPendingExt(t.Context(), &redis.XPendingExtArgs{
		Stream: stream, Group: "ledger", Start: "-", End: "+", Count: 1000, Consumer: consumer,
	}).Result()
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(p))
	for i, e := range p {
		ids[i] = e.ID
	}
	return ids
}

// allAcked reports whether the group has been delivered the stream's last
// entry and has no entry pending.
func allAcked(ctx context.Context, rdb *redis.Client, stream string) bool {
	last, err := rdb.XRevRangeN(ctx, stream, "+", "-", 1).Result()
	if err != nil || len(last) == 0 {
		return false
	}
	groups, err := rdb.XInfoGroups(ctx, stream).Result()
	if err != nil || len(groups) != 1 {
		return false
	}
	return groups[0].LastDeliveredID == last[0].ID && groups[0].Pending == 0
}

// checkLedger checks that every payment of the stream was credited exactly
// once and that every balance is the sum of its account's payments, and
// returns the number of credits counted.
func checkLedger(t *testing.T, rdb *redis.Client, stream string, entries int) int {
	t.Helper()
	ctx := t.Context()
	msgs, err := rdb.XRange(ctx, stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != entries {
		t.Fatalf("%d entries in the stream, want %d", len(msgs), entries)
	}
	payments := map[string]payment{}
	want := map[string]int64{}
	for _, m := range msgs {
		e := parseEntry(m, "")
		if _, dup := payments[e.payment]; !dup {
			payments[e.payment] = payment{id: e.payment, account: e.account, amount: e.amount}
			want[e.account] += e.amount
		}
	}
	l := ledgerOf(stream)
	applied, err := rdb.HGetAll(ctx, l.applied).Result()
	if err != nil {
		t.Fatal(err)
	}
	credits, wrong := 0, 0
	for id := range payments {
		n, _ := strconv.Atoi(applied[id])
		credits += n
		if n != 1 {
			if wrong++; wrong <= 10 {
				t.Errorf("payment %s credited %d times, want 1", id, n)
			}
		}
	}
	if wrong > 0 {
		t.Errorf("%d of %d payments not credited exactly once (%d credits counted)", wrong, len(payments), credits)
	}
	if len(applied) != len(payments) {
		t.Errorf("%d payments in the ledger, %d in the stream", len(applied), len(payments))
	}
	balances, err := rdb.HGetAll(ctx, l.balances).Result()
	if err != nil {
		t.Fatal(err)
	}
	for a, w := range want {
		if got, _ := strconv.ParseInt(balances[a], 10, 64); got != w {
			t.Errorf("%s: balance %s, want %s", a, cents(got), cents(w))
		}
	}
	return credits
}

// logLine is one entry's outcome, as a consumer logs it.
type logLine struct {
	consumer, entry, payment, via, outcome, by string
	acked                                      bool
}

// logLines parses the outcome lines of a consumer's output.
func logLines(out string) []logLine {
	var ls []logLine
	for line := range strings.Lines(out) {
		if !strings.HasPrefix(line, "consumer=") {
			continue
		}
		line, _, _ = strings.Cut(strings.TrimSpace(line), " err=")
		var l logLine
		for f := range strings.FieldsSeq(line) {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "consumer":
				l.consumer = v
			case "entry":
				l.entry = v
			case "payment":
				l.payment = v
			case "via":
				l.via = v
			case "outcome":
				l.outcome = v
			case "by":
				l.by = v
			case "acked":
				l.acked = v == "true"
			}
		}
		ls = append(ls, l)
	}
	return ls
}
