//go:build unix

package consumerkill

import (
	"context"
	"crypto/rand"
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

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// The figures of the kill tests: 300 payments, every tenth sent twice
// (330 entries), consumers reading 10 entries at a time; the victim
// credits and acks 3 entries and is killed at the 4th, with 7 pending.
const (
	killPayments = 300
	killBatch    = 10
	killPass     = 3
)

// Where testKill kills the victim.
const (
	beforeEffect = "before the credit" // its EVALSHA held: inside Do, the key held, nothing credited
	afterDo      = "at the XACK"       // its XACK held: Do returned, the result stored
)

// TestKillBeforeEffect kills a consumer inside Do, before its credit
// reaches Redis, with the payment's key held and its batch pending. The
// survivors claim its entries; for the held one Do answers ErrConflict
// (no XACK) while the dead consumer's lease lasts, then runs the credit.
// Every payment is credited once, every entry acked.
func TestKillBeforeEffect(t *testing.T) { testKill(t, beforeEffect) }

// TestKillAfterDo kills a consumer after Do credited a payment and stored
// its result, at the entry's XACK: a survivor claims the entry, Do replays
// the victim's result without crediting again, and the survivor acks it.
func TestKillAfterDo(t *testing.T) { testKill(t, afterDo) }

func testKill(t *testing.T, point string) {
	addr := redistest.Addr(t)
	rdb := newClient(t, addr)
	stream := newStream(t, rdb)
	entries := produce(t, rdb, stream, killPayments, func(n int) bool { return n%10 == 0 })
	held := entries[killPass]
	heldPayment := paymentOf(held).id

	px := startProxy(t, addr)
	if point == beforeEffect {
		px.holdFirst(isCredit(stream, heldPayment))
	} else {
		px.holdFirst(isXAck(held.ID))
	}
	victim := startConsumer(t, "victim", consumerFlags(px.addr(), stream, "-consumer", "victim")...)
	px.waitHeld(t, victim, 30*time.Second)
	// Before the credit, the held payment's lease as Redis counts it just
	// before the kill: it runs out no earlier than expiry (a renewal in
	// between only puts it off; none comes after the kill). A claim
	// decided before then had to end in ErrConflict.
	var expiry time.Time
	if point == beforeEffect {
		read := time.Now()
		pttl := rdb.PTTL(t.Context(), "idem:"+idem.OperationStorageKey("", stream+"/"+group, heldPayment)).Val()
		if pttl <= 0 {
			t.Fatalf("the held payment's lease before the kill: PTTL %v, want it in flight", pttl)
		}
		expiry = read.Add(pttl)
	}
	victim.kill()
	killed := time.Now()

	// It had credited and acked the entries before the held one, and
	// logged nothing of the held one: it died there.
	if got, want := entryLines(victim.output()), expect(entries[:killPass], "read", "applied", "victim", true); !slices.Equal(got, want) {
		t.Fatalf("the victim's entries:\n%s\nwant:\n%s\nits output:\n%s", lines(got), lines(want), victim.output())
	}
	pending := pendingOf(t, rdb, stream, "victim")
	if want := ids(entries[killPass:killBatch]); !slices.Equal(pending, want) {
		t.Fatalf("killed %s of %s: pending with it %v, want %v", point, held.ID, pending, want)
	}

	survivors := []*proc{
		startConsumer(t, "s1", consumerFlags(addr, stream, "-consumer", "s1")...),
		startConsumer(t, "s2", consumerFlags(addr, stream, "-consumer", "s2")...),
	}
	settled := poll(60*time.Second, func() bool { return allAcked(t, rdb, stream) })
	took := time.Since(killed)
	var logged []logLine
	for _, s := range survivors {
		if err := s.stop(10 * time.Second); err != nil || !strings.Contains(s.output(), "msg=stopped") {
			t.Errorf("%s after SIGTERM: %v\n%s", s.name, err, s.output())
		}
		logged = append(logged, logLines(s.output())...)
	}
	if !settled {
		p, _ := rdb.XPending(t.Context(), stream, group).Result()
		t.Fatalf("entries still pending or undelivered 60s after the kill: XPENDING %+v", p)
	}
	l := checkLedger(t, rdb, stream)

	// The victim's entries were claimed by the survivors, and acked there.
	for _, id := range pending {
		if !slices.ContainsFunc(logged, func(l logLine) bool { return l.entry == id && l.via == "claim" && l.acked }) {
			t.Errorf("the victim's entry %s was not claimed and acked by a survivor", id)
		}
	}
	heldLines := func(outcome string) []logLine {
		var ls []logLine
		for _, l := range logged {
			if l.entry == held.ID && l.via == "claim" && l.outcome == outcome {
				ls = append(ls, l)
			}
		}
		return ls
	}
	by := l.credits[heldPayment]
	noVerdict := ""
	switch point {
	case beforeEffect:
		if len(by) != 1 || by[0] == "victim" {
			t.Errorf("%s credited by %v, want once by a survivor (the victim was killed before its credit)", heldPayment, by)
		}
		c := heldLines("conflict")
		if slices.ContainsFunc(c, func(l logLine) bool { return l.acked }) {
			t.Errorf("claims of %s ending in ErrConflict while the dead victim's lease lasted: %+v, want none acked", held.ID, c)
		}
		if len(c) == 0 {
			// The survivors start, and claim, on a real clock: on a
			// loaded machine every claim may come after the lease ran
			// out. A claim logged before then (its time is truncated to
			// the millisecond) was decided before then.
			var early, claims []logLine
			for _, l := range logged {
				if l.entry == held.ID && l.via == "claim" {
					claims = append(claims, l)
					if !l.at.IsZero() && l.at.Add(time.Millisecond).Before(expiry) {
						early = append(early, l)
					}
				}
			}
			if len(early) > 0 {
				t.Errorf("claims of %s within the dead victim's lease (it ran out %v after the kill) not ending in ErrConflict: %+v",
					held.ID, expiry.Sub(killed).Round(time.Millisecond), early)
			} else {
				noVerdict = fmt.Sprintf("no claim of %s came within the dead victim's lease, which ran out %v after the kill "+
					"(the claims: %+v): a loaded machine; no verdict on the ErrConflict a claim gets meanwhile",
					held.ID, expiry.Sub(killed).Round(time.Millisecond), claims)
			}
		}
	case afterDo:
		if !slices.Equal(by, []string{"victim"}) {
			t.Errorf("%s credited by %v, want once by the victim (killed after Do)", heldPayment, by)
		}
		if r := heldLines("replayed"); !slices.ContainsFunc(r, func(l logLine) bool { return l.by == "victim" && l.acked }) {
			t.Errorf("no survivor replayed the victim's result for %s and acked it: %+v", held.ID, r)
		}
	}
	var claims, conflicts, replays int
	for _, l := range logged {
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
	t.Logf("%d payments in %d entries; victim killed (SIGKILL) %s of %s with %d entries pending; "+
		"survivors: %d deliveries by XAUTOCLAIM, %d ErrConflict, %d replays; %d credits counted for %d payments; all acked %v after the kill",
		killPayments, len(entries), point, heldPayment, len(pending), claims, conflicts, replays, l.credited(), len(l.payments), took.Round(time.Millisecond))
	if noVerdict != "" {
		t.Skip(noVerdict)
	}
}

// TestStopFinishesEntryInHand stops (SIGTERM) a consumer whose credit is
// held: it finishes that entry (credit and XACK), leaves the rest of its
// batch pending, and exits 0 once its records are stored. Started again
// under the same name, it reads those entries back first, and every
// payment is credited once.
func TestStopFinishesEntryInHand(t *testing.T) {
	addr := redistest.Addr(t)
	rdb := newClient(t, addr)
	stream := newStream(t, rdb)
	entries := produce(t, rdb, stream, 30, func(n int) bool { return n%10 == 0 })
	held := entries[2]
	px := startProxy(t, addr)
	px.holdFirst(isCredit(stream, paymentOf(held).id))
	c := startConsumer(t, "c1", consumerFlags(px.addr(), stream, "-consumer", "c1")...)
	h := px.waitHeld(t, c, 30*time.Second)
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The credit goes on once the consumer has seen the signal.
	if !poll(10*time.Second, func() bool { return strings.Contains(c.output(), "msg=stopping") }) {
		t.Fatalf("no msg=stopping within 10s of SIGTERM:\n%s", c.output())
	}
	close(h.release)
	t.Logf("credit held for %v", time.Since(h.at).Round(time.Microsecond))
	if err := c.wait(10 * time.Second); err != nil {
		t.Fatalf("after SIGTERM: %v\n%s", err, c.output())
	}
	out := c.output()
	want := expect(entries[:3], "read", "applied", "c1", true)
	if got := entryLines(out); !slices.Equal(got, want) || !strings.Contains(out, "msg=stopped") ||
		strings.Index(out, "msg=stopping") > strings.Index(out, "entry="+held.ID) {
		t.Errorf("want SIGTERM seen while %s was in hand, that entry finished and nothing after, records stored:\n%s\nwant:\n%s\nits output:\n%s",
			held.ID, lines(got), lines(want), out)
	}
	left := pendingOf(t, rdb, stream, "c1")
	if want := ids(entries[3:killBatch]); !slices.Equal(left, want) {
		t.Errorf("pending after the stop: %v, want the entries after the one in hand %v", left, want)
	}
	if l, err := readLedger(t.Context(), rdb, stream); err != nil || l.credited() != 3 {
		t.Errorf("%d payments credited before the restart (%v), want 3", l.credited(), err)
	}

	again := startConsumer(t, "c1-again", consumerFlags(addr, stream, "-consumer", "c1")...)
	if !poll(30*time.Second, func() bool { return allAcked(t, rdb, stream) }) {
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
	checkLedger(t, rdb, stream)
}

// TestRestartReadsOwnPending kills a consumer at its 2nd XACK, with 4
// entries of its batch of 5 pending under its name, and starts it again
// under the same name (no other consumer, and none of its entries idle
// long enough to be claimed): it reads its pending entries back first
// (XREADGROUP ... 0), where Do replays the one it had credited and
// credits the others, then reads the new ones. Each payment is credited
// once.
func TestRestartReadsOwnPending(t *testing.T) {
	addr := redistest.Addr(t)
	rdb := newClient(t, addr)
	stream := newStream(t, rdb)
	entries := produce(t, rdb, stream, 10, func(int) bool { return false })
	px := startProxy(t, addr)
	px.holdFirst(isXAck(entries[1].ID))
	flags := func(addr string) []string {
		return consumerFlags(addr, stream, "-consumer", "c1", "-count", "5", "-min-idle", "1m")
	}
	c := startConsumer(t, "c1", flags(px.addr())...)
	px.waitHeld(t, c, 30*time.Second)
	c.kill()
	if got, want := entryLines(c.output()), expect(entries[:1], "read", "applied", "c1", true); !slices.Equal(got, want) {
		t.Fatalf("before the kill:\n%s\nwant:\n%s", lines(got), lines(want))
	}
	if got, want := pendingOf(t, rdb, stream, "c1"), ids(entries[1:5]); !slices.Equal(got, want) {
		t.Fatalf("pending after the kill: %v, want %v", got, want)
	}

	again := startConsumer(t, "c1-again", flags(addr)...)
	if !poll(30*time.Second, func() bool { return allAcked(t, rdb, stream) }) {
		t.Fatalf("not all acked after the restart:\n%s", again.output())
	}
	if err := again.stop(10 * time.Second); err != nil {
		t.Errorf("after SIGTERM: %v\n%s", err, again.output())
	}
	want := slices.Concat(
		expect(entries[1:2], "history", "replayed", "c1", true),
		expect(entries[2:5], "history", "applied", "c1", true),
		expect(entries[5:], "read", "applied", "c1", true))
	if got := entryLines(again.output()); !slices.Equal(got, want) {
		t.Errorf("after the restart:\n%s\nwant:\n%s", lines(got), lines(want))
	}
	checkLedger(t, rdb, stream)
}

// consumerFlags are the flags of a consumer on the Redis at addr: a short
// -min-idle, so that claims come quickly, and a -lease longer than it, so
// that a claim of a dead consumer's payment within its lease is seen to
// end in ErrConflict; then extra, which may override them.
func consumerFlags(addr, stream string, extra ...string) []string {
	return append([]string{"-redis", addr, "-stream", stream, "-group", group, "-min-idle", "500ms", "-lease", "3s",
		"-block", "100ms", "-count", strconv.Itoa(killBatch)}, extra...)
}

// newClient is a client for the test's own reads and writes, closed when
// the test ends.
func newClient(t *testing.T, addr string) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// newStream returns a stream name of the test's own; the stream and its
// ledger are deleted when the test ends (the Redis may be
// IDEM_REDIS_ADDR's, shared). idem's records expire.
func newStream(t *testing.T, rdb *redis.Client) string {
	stream := "consumerkill-" + strings.ToLower(rand.Text()[:8])
	t.Cleanup(func() { rdb.Del(context.Background(), stream, creditsKey(stream), balancesKey(stream)) })
	return stream
}

// produce adds payments 1 to n to stream, twice those for which twice
// reports true (a producer retrying an XADD), and returns the entries.
func produce(t *testing.T, rdb *redis.Client, stream string, n int, twice func(int) bool) []redis.XMessage {
	t.Helper()
	ctx := t.Context()
	for i := 1; i <= n; i++ {
		p := payment{id: fmt.Sprintf("pay-%05d", i), account: "acct-" + strconv.Itoa(1+i%3), amount: int64(500 + (i*739)%4500)}
		times := 1
		if twice(i) {
			times = 2
		}
		for range times {
			if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"id", p.id, "account", p.account, "amount", p.amount}}).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	msgs, err := rdb.XRange(ctx, stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	return msgs
}

// ids returns the ids of msgs.
func ids(msgs []redis.XMessage) []string {
	s := make([]string, len(msgs))
	for i, m := range msgs {
		s[i] = m.ID
	}
	return s
}

// pendingOf returns the ids of the entries pending with consumer.
func pendingOf(t *testing.T, rdb *redis.Client, stream, consumer string) []string {
	t.Helper()
	p, err := rdb.XPendingExt(t.Context(), &redis.XPendingExtArgs{
		Stream: stream, Group: group, Start: "-", End: "+", Count: 1000, Consumer: consumer,
	}).Result()
	if err != nil {
		t.Fatal(err)
	}
	s := make([]string, len(p))
	for i, e := range p {
		s[i] = e.ID
	}
	return s
}

// allAcked reports whether the group has been given the stream's last
// entry and has no entry pending.
func allAcked(t *testing.T, rdb *redis.Client, stream string) bool {
	last, err := rdb.XRevRangeN(t.Context(), stream, "+", "-", 1).Result()
	if err != nil || len(last) == 0 {
		return false
	}
	groups, err := rdb.XInfoGroups(t.Context(), stream).Result()
	return err == nil && len(groups) == 1 && groups[0].LastDeliveredID == last[0].ID && groups[0].Pending == 0
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
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// proc is a consumer process.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  string // the file of its stdout and stderr
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

// stop sends SIGTERM and waits for the exit, like wait.
func (p *proc) stop(timeout time.Duration) error {
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	return p.wait(timeout)
}

// wait waits for the exit; after timeout it kills the process. It returns
// Wait's error (nil: exit status 0).
func (p *proc) wait(timeout time.Duration) error {
	timer := time.AfterFunc(timeout, func() { p.cmd.Process.Kill() })
	defer timer.Stop()
	p.once.Do(func() { p.err = p.cmd.Wait() })
	if !timer.Stop() {
		return fmt.Errorf("no exit within %v: killed (%v)", timeout, p.err)
	}
	return p.err
}

// output returns what the process printed so far.
func (p *proc) output() string {
	b, _ := os.ReadFile(p.out)
	return string(b)
}

// logLine is how an entry ended, as a consumer logs it (msg=entry), and
// when (slog's time, to the millisecond).
type logLine struct {
	consumer, entry, payment, via, outcome, by string
	acked                                      bool
	at                                         time.Time
}

// String is the line's fields that the tests compare.
func (l logLine) String() string {
	return fmt.Sprintf("%s %s via=%s outcome=%s by=%s acked=%t", l.entry, l.payment, l.via, l.outcome, l.by, l.acked)
}

// logLines parses the entry lines of a consumer's output.
func logLines(out string) []logLine {
	var ls []logLine
	for line := range strings.Lines(out) {
		if !strings.Contains(line, " msg=entry ") {
			continue
		}
		line, _, _ = strings.Cut(strings.TrimSpace(line), " err=") // err is last, and quoted
		var l logLine
		for f := range strings.FieldsSeq(line) {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "time":
				l.at, _ = time.Parse(time.RFC3339Nano, v)
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

// entryLines is logLines as strings, to compare with expect's.
func entryLines(out string) []string {
	var s []string
	for _, l := range logLines(out) {
		s = append(s, l.String())
	}
	return s
}

// expect is the lines of msgs, each with via, outcome, by and acked.
func expect(msgs []redis.XMessage, via, outcome, by string, acked bool) []string {
	var s []string
	for _, m := range msgs {
		s = append(s, logLine{entry: m.ID, payment: paymentOf(m).id, via: via, outcome: outcome, by: by, acked: acked}.String())
	}
	return s
}

// lines joins lines, one a line.
func lines(s []string) string { return strings.Join(s, "\n") }
