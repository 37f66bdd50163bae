// Command consumer is a Redis Streams consumer-group worker whose side
// effect happens once per payment, with idem's Middleware.Do, also when a
// consumer dies in the middle of a message and another one claims it.
//
//	go run ./examples/consumer                    # the demo, on an in-process miniredis; prints a ledger; exits
//	go run ./examples/consumer -demo -redis localhost:6379   # the same demo on a real Redis
//	go run ./examples/consumer -redis localhost:6379 -produce 100   # add 100 payments to the stream, exit
//	go run ./examples/consumer -redis localhost:6379 -consumer c1   # a worker, until SIGTERM or SIGINT
//
// Each stream entry is a payment: the fields id (the payment's id, given by
// the producer), account and amount (in cents). The side effect credits
// the account: it adds the amount to a balance in Redis, an increment that
// applied twice credits twice. The worker (see worker.run) joins the
// consumer group (XGROUP CREATE ... MKSTREAM; BUSYGROUP means it exists),
// first processes the entries still pending under its own name (what it
// read and never acked before a restart: XREADGROUP ... 0), then loops:
// XAUTOCLAIM the entries pending longer than -min-idle, then XREADGROUP
// new ones (BLOCK -block, so that a stop is prompt), and for each entry
//
//	m.Do(ctx, stream+"/"+group, payment id, credit)
//
// then XACK. The entry's fate follows Do's answer:
//
//   - the credit ran here (applied), or it ran before and Do returns its
//     stored result without running it (replayed): XACK. A replay is the
//     normal end of a redelivery.
//   - ErrConflict: another consumer is crediting this payment right now
//     (or died while doing so and its lease has not expired yet). No XACK:
//     the entry stays pending, XAUTOCLAIM brings it back after -min-idle,
//     and then Do replays the other's result, or runs the credit if the
//     other died before storing one.
//   - the credit's own error (the key is released) or the store's
//     (ErrStoreUnavailable: the credit did not run): no XACK, the entry
//     comes back the same way.
//   - an entry without a valid payment id or amount (rejected), or
//     ErrNotReplayable (the credit ran, its result was not kept): XACK, as
//     no redelivery would change the outcome.
//
// # The key: the payment's id, not the entry's
//
// A redelivery within a consumer group is the same entry, with the same
// stream id, so the entry id would do as the key for it. But a producer
// that retries an XADD whose reply it lost (a timeout, a failover) adds a
// second entry, with a new stream id, for the same payment. The key is
// therefore the business id the producer puts in the entry (field id), so
// that both kinds of duplicate credit once; the demo and -produce send
// every tenth payment twice. A producer without such an id can key by the
// entry id (e.ID) and is protected against redeliveries only. op, the
// stream and the group, keeps these keys apart from other operations:
// another group on the same stream does other work and needs its own
// records.
//
// # XAUTOCLAIM: redelivery from a dead consumer
//
// An entry read by a consumer stays in the group's pending entries list,
// owned by that consumer, until someone XACKs it. When a consumer dies,
// nothing else brings its entries back: XAUTOCLAIM moves to the caller
// the pending entries that no one was given (read or claimed) for longer
// than -min-idle, whoever owns them, and returns them. Every worker calls
// it on every loop, so the entries of a dead consumer are processed by the
// living ones after -min-idle. XAUTOCLAIM cannot tell a dead consumer from
// a slow one: an entry whose processing outlasts -min-idle is claimed by
// another consumer while the first still works on it; Do answers the
// second with ErrConflict, and the credit runs once. Choose -min-idle
// longer than most processing and at least -lease (shorter only costs
// claims that end in ErrConflict). XACK is the group's, not the
// consumer's: the first worker acks the entry it finished even if
// another has claimed it since.
//
// # What remains: a death after the credit and before its record
//
// Do stores the result right after fn returns. A consumer killed between
// the credit's commit in Redis and that store (a window of one round trip)
// leaves a credit done and no record: once its lease expires, the
// redelivered entry runs the credit again. The same holds for a consumer
// frozen (a stop, a pause of the VM) longer than -lease while it credits:
// its lease lapses and another consumer runs the credit too. No ordering
// of steps closes this with an effect in one system and the record in
// another; it closes when the effect and the record commit together. On
// PostgreSQL, pgstore's Fence joins the effect's transaction to the
// record (see storage/pgstore and examples/postgres): the effect then
// commits only while the lease is held, together with the record. Here the
// effect is in Redis, outside the store's transaction: a payment is
// credited once whenever a consumer dies, except in that window (or
// freezes past its lease). The tests kill consumers before the credit and
// after Do, never in between.
//
// The credit itself is a Lua script (see creditScript) that records the
// execution (idem's lease token, Info.Owner, unique per execution) with
// HSETNX and credits only if it was not recorded yet: go-redis resends a
// script whose reply timed out, and the credit retries it itself a few
// times, and neither may credit twice. (A credit that gives up returns an
// error and releases the key, so an attempt that did credit unseen opens
// the same window as a death.) The script keeps, in hashes on the stream's hash slot, the executions,
// the number of executions per payment (the ledger the tests count), the
// consumer that credited each payment, and the balances.
//
// A record is kept for -ttl (24 hours): a payment redelivered or produced
// again after that is credited again. An entry whose credit always fails
// stays pending and comes back every -min-idle; a real worker would move
// it aside after some deliveries (XPENDING reports how many).
//
// # Shutdown
//
// On SIGTERM or SIGINT the worker stops reading, finishes the entry in
// hand (its credit and XACK run on a context the signal does not cancel),
// leaves the rest of its batch pending (its next start reads them back,
// or other consumers claim them), then calls Middleware.Shutdown, which
// waits for the records still being stored, and closes the client.
//
// # Test knobs
//
// -pause-at before-effect (inside the credit, with the key held) or
// -pause-at after-do (after Do returned, before XACK) holds the consumer at
// that point once it has passed it -pause-after times: it writes the
// entry's stream id and payment id to -pause-file and waits until SIGTERM
// or SIGINT (then goes on), so a test can kill it there. -unprotected
// calls the credit directly instead of through Do: it breaks the guarantee
// on purpose, to show that the tests notice.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/redis/go-redis/v9"
)

// options is what the command line sets.
type options struct {
	redis    string // Redis address; "": the demo on an in-process miniredis
	demo     bool
	stream   string
	group    string
	consumer string
	minIdle  time.Duration // XAUTOCLAIM's min-idle-time
	lease    time.Duration // idem's lease
	ttl      time.Duration // idem's record TTL
	block    time.Duration // XREADGROUP's BLOCK
	count    int64         // entries per XREADGROUP and XAUTOCLAIM
	produce  int           // add this many payments and exit

	// Test knobs.
	pauseAt     string // "", pointBeforeEffect or pointAfterDo
	pauseAfter  int
	pauseFile   string
	unprotected bool
}

// The points -pause-at can hold a consumer at.
const (
	pointBeforeEffect = "before-effect"
	pointAfterDo      = "after-do"
)

func main() {
	log.SetFlags(0)
	o := options{}
	host, _ := os.Hostname()
	flag.StringVar(&o.redis, "redis", "", "Redis address (host:port); without it: the demo on an in-process miniredis")
	flag.BoolVar(&o.demo, "demo", false, "run the demo (on -redis when given): produce, crash a consumer, let others claim, print the ledger, exit")
	flag.StringVar(&o.stream, "stream", "payments", "stream name")
	flag.StringVar(&o.group, "group", "ledger", "consumer group name")
	flag.StringVar(&o.consumer, "consumer", host+"-"+strconv.Itoa(os.Getpid()), "consumer name (keep it across restarts: a consumer reads back its own pending entries)")
	flag.DurationVar(&o.minIdle, "min-idle", 30*time.Second, "claim (XAUTOCLAIM) entries pending longer than this; at least -lease")
	flag.DurationVar(&o.lease, "lease", 10*time.Second, "idem's lease: how long a dead consumer's key stays locked")
	flag.DurationVar(&o.ttl, "ttl", 24*time.Hour, "how long a payment's record is kept: its duplicates within it are not credited again")
	flag.DurationVar(&o.block, "block", 2*time.Second, "XREADGROUP BLOCK time: how long a stop may wait, and how often an idle worker claims")
	flag.Int64Var(&o.count, "count", 10, "entries per XREADGROUP and XAUTOCLAIM")
	flag.IntVar(&o.produce, "produce", 0, "add this many payments to the stream (every tenth twice, as a producer that retries) and exit; needs -redis")
	flag.StringVar(&o.pauseAt, "pause-at", "", "test only: hold at "+pointBeforeEffect+" or "+pointAfterDo+" until SIGTERM (see -pause-file)")
	flag.IntVar(&o.pauseAfter, "pause-after", 0, "test only: pass the -pause-at point this many times before holding there")
	flag.StringVar(&o.pauseFile, "pause-file", "", "test only: where to write \"<entry id> <payment id>\" when held")
	flag.BoolVar(&o.unprotected, "unprotected", false, "test only: credit without idem (breaks the guarantee on purpose)")
	flag.Parse()

	var err error
	switch {
	case o.produce > 0 && o.redis == "":
		err = errors.New("-produce needs -redis")
	case o.redis == "" || o.demo:
		err = runDemo(o.redis, os.Stdout)
	case o.produce > 0:
		err = produceCmd(o, os.Stdout)
	default:
		err = consume(o, os.Stdout)
	}
	if err != nil {
		log.Fatal(err)
	}
}

// newClient is the Redis client of a consumer or producer:
// redisstore.ClientOptions, the options recommended for the store.
func newClient(addr string) *redis.Client { return redis.NewClient(redisstore.ClientOptions(addr)) }

// consume runs a worker until SIGTERM or SIGINT, then shuts it down.
func consume(o options, out io.Writer) error {
	if o.pauseAt != "" && o.pauseAt != pointBeforeEffect && o.pauseAt != pointAfterDo {
		return fmt.Errorf("-pause-at %q: want %s or %s", o.pauseAt, pointBeforeEffect, pointAfterDo)
	}
	rdb := newClient(o.redis)
	defer rdb.Close()
	m, err := idem.New(redisstore.New(rdb), idem.WithLease(o.lease), idem.WithTTL(o.ttl))
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	w := &worker{
		rdb: rdb, m: m, stream: o.stream, group: o.group, name: o.consumer,
		minIdle: o.minIdle, block: o.block, count: o.count, unprotected: o.unprotected,
		report: func(r outcome) { fmt.Fprintln(out, r) },
	}
	if o.pauseAt != "" {
		p := &pauser{at: o.pauseAt, after: o.pauseAfter, file: o.pauseFile, until: ctx.Done()}
		w.hold = p.hold
	}
	fmt.Fprintf(out, "consumer %s: stream %s, group %s, min-idle %v, lease %v\n", w.name, w.stream, w.group, o.minIdle, o.lease)
	runErr := w.run(ctx)
	stop() // a second signal kills the process
	fmt.Fprintln(out, "shutdown: stopped reading")
	sctx, cancel := context.WithTimeout(context.Background(), o.lease)
	defer cancel()
	if err := m.Shutdown(sctx); err != nil {
		fmt.Fprintf(out, "shutdown: %v\n", err)
		return err
	}
	fmt.Fprintln(out, "shutdown: records stored")
	if errors.Is(runErr, context.Canceled) {
		return nil
	}
	return runErr
}

// worker is one consumer of the group.
type worker struct {
	rdb                 *redis.Client
	m                   *idem.Middleware
	stream, group, name string
	minIdle, block      time.Duration
	count               int64
	unprotected         bool // -unprotected: credit without Do

	// report is told how each entry ended.
	report func(outcome)
	// hold, when set, is called at pointBeforeEffect and pointAfterDo; an
	// error there ends the credit (before-effect) or the worker's run
	// without an XACK (after-do), which the demo uses to play a crash.
	hold func(ctx context.Context, point string, e entry) error

	cursor string // XAUTOCLAIM's next start
}

// entry is a stream entry as a payment.
type entry struct {
	id      string // stream id
	via     string // how it came: "read", "claim" (XAUTOCLAIM) or "history" (own pending, at start)
	payment string // field id
	account string
	amount  int64  // cents
	bad     string // why the entry is not a payment, or ""
}

func parseEntry(m redis.XMessage, via string) entry {
	e := entry{id: m.ID, via: via}
	e.payment, _ = m.Values["id"].(string)
	e.account, _ = m.Values["account"].(string)
	amount, _ := m.Values["amount"].(string)
	var err error
	e.amount, err = strconv.ParseInt(amount, 10, 64)
	switch {
	case m.Values == nil:
		e.bad = "entry deleted from the stream"
	case e.payment == "":
		e.bad = "no payment id"
	case e.account == "":
		e.bad = "no account"
	case err != nil:
		e.bad = "bad amount " + strconv.Quote(amount)
	}
	return e
}

// outcome is how one entry ended, for the log: one line, key=value.
type outcome struct {
	consumer string
	e        entry
	what     string // applied, replayed, conflict, failed, rejected, lost
	by       string // the consumer that credited (applied, replayed)
	balance  int64  // the account's balance after the credit (applied, replayed)
	acked    bool
	err      error
}

func (r outcome) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "consumer=%s entry=%s payment=%s via=%s outcome=%s", r.consumer, r.e.id, r.e.payment, r.e.via, r.what)
	if r.by != "" {
		fmt.Fprintf(&b, " by=%s balance=%s", r.by, cents(r.balance))
	}
	fmt.Fprintf(&b, " acked=%t", r.acked)
	if r.err != nil {
		fmt.Fprintf(&b, " err=%q", r.err.Error())
	}
	return b.String()
}

// errStop ends a worker's run at a hold point without an XACK.
var errStop = errors.New("consumer stopped at a hold point")

// run consumes until ctx ends, or a hold point returns an error. The
// entry in hand when ctx ends is finished (credit and XACK), the rest of
// its batch is left pending.
func (w *worker) run(ctx context.Context) error {
	if err := w.join(ctx); err != nil {
		return err
	}
	// A restarted consumer first reads back its own pending entries: they
	// were delivered to it and never acked.
	for start := "0"; ctx.Err() == nil; {
		msgs, err := w.read(ctx, start, -1)
		if err != nil {
			return err
		}
		if len(msgs) == 0 {
			break
		}
		if err := w.handleAll(ctx, msgs, "history"); err != nil {
			return err
		}
		start = msgs[len(msgs)-1].ID
	}
	w.cursor = "0-0"
	for ctx.Err() == nil {
		claimed, next, err := w.rdb.XAutoClaim(ctx, &redis.XAutoClaimArgs{
			Stream: w.stream, Group: w.group, Consumer: w.name,
			MinIdle: w.minIdle, Start: w.cursor, Count: w.count,
		}).Result()
		if err == nil {
			w.cursor = next
			err = w.handleAll(ctx, claimed, "claim")
		}
		if err == nil {
			var msgs []redis.XMessage
			if msgs, err = w.read(ctx, ">", w.block); err == nil {
				err = w.handleAll(ctx, msgs, "read")
			}
		}
		switch {
		case errors.Is(err, errStop):
			return err
		case err != nil && ctx.Err() == nil:
			// Redis failed: wait a little, and join again in case the
			// stream or the group was deleted.
			log.Printf("consumer %s: %v", w.name, err)
			select {
			case <-ctx.Done():
			case <-time.After(w.block):
			}
			if strings.HasPrefix(err.Error(), "NOGROUP") {
				w.join(ctx)
			}
		}
	}
	return ctx.Err()
}

// join creates the group at the start of the stream, and the stream if
// need be; a group that exists is fine.
func (w *worker) join(ctx context.Context) error {
	err := w.rdb.XGroupCreateMkStream(ctx, w.stream, w.group, "0").Err()
	if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return fmt.Errorf("XGROUP CREATE %s %s: %w", w.stream, w.group, err)
	}
	return nil
}

// read is XREADGROUP from start: ">" for new entries, blocking up to
// block; an id for this consumer's own pending entries after it, with
// block < 0 (not blocking).
func (w *worker) read(ctx context.Context, start string, block time.Duration) ([]redis.XMessage, error) {
	streams, err := w.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: w.group, Consumer: w.name, Streams: []string{w.stream, start},
		Count: w.count, Block: block,
	}).Result()
	if errors.Is(err, redis.Nil) || len(streams) == 0 {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return streams[0].Messages, nil
}

// handleAll handles msgs in order, until ctx ends: the entries after the
// one in hand stay pending.
func (w *worker) handleAll(ctx context.Context, msgs []redis.XMessage, via string) error {
	for _, msg := range msgs {
		if ctx.Err() != nil {
			return nil
		}
		// The entry in hand is finished whatever the signal: its credit
		// and its XACK do not stop half-way.
		if err := w.handle(context.WithoutCancel(ctx), parseEntry(msg, via)); err != nil {
			return err
		}
	}
	return nil
}

// handle credits the payment of e once, through Do, and acks e when that
// is settled.
func (w *worker) handle(ctx context.Context, e entry) error {
	r := outcome{consumer: w.name, e: e}
	if e.bad != "" {
		r.what, r.err = "rejected", errors.New(e.bad)
		r.acked = w.ack(ctx, e, &r)
		w.report(r)
		return nil
	}
	ran := false
	credit := func(ctx context.Context) ([]byte, error) {
		if err := w.pause(ctx, pointBeforeEffect, e); err != nil {
			return nil, err
		}
		ran = true
		return w.credit(ctx, e)
	}
	var res []byte
	var err error
	if w.unprotected {
		res, err = credit(ctx)
	} else {
		res, err = w.m.Do(ctx, w.stream+"/"+w.group, e.payment, credit)
	}
	switch {
	case err == nil:
		var c credited
		if jerr := json.Unmarshal(res, &c); jerr != nil {
			r.err = jerr
		}
		r.what, r.by, r.balance = "replayed", c.Consumer, c.Balance
		if ran {
			r.what = "applied"
		}
		if err := w.pause(ctx, pointAfterDo, e); err != nil {
			w.report(r)
			return err
		}
		r.acked = w.ack(ctx, e, &r)
	case errors.Is(err, idem.ErrConflict):
		r.what = "conflict" // pending: XAUTOCLAIM brings it back
	case errors.Is(err, idem.ErrNotReplayable):
		r.what, r.err = "lost", err // credited, its result not kept
		r.acked = w.ack(ctx, e, &r)
	case errors.Is(err, idem.ErrInvalidKey):
		r.what, r.err = "rejected", err
		r.acked = w.ack(ctx, e, &r)
	case errors.Is(err, errStop):
		w.report(outcome{consumer: w.name, e: e, what: "stopped"})
		return err
	default:
		r.what, r.err = "failed", err // released: XAUTOCLAIM brings it back
	}
	w.report(r)
	return nil
}

// pause calls w.hold, if set.
func (w *worker) pause(ctx context.Context, point string, e entry) error {
	if w.hold == nil {
		return nil
	}
	return w.hold(ctx, point, e)
}

// ack acknowledges e; a failure is noted in r and leaves e pending, to be
// claimed and replayed later.
func (w *worker) ack(ctx context.Context, e entry, r *outcome) bool {
	if err := w.rdb.XAck(ctx, w.stream, w.group, e.id).Err(); err != nil {
		r.err = errors.Join(r.err, fmt.Errorf("XACK: %w", err))
		return false
	}
	return true
}

// credited is the result Do stores for a payment, and replays.
type credited struct {
	Entry    string `json:"entry"`    // the stream entry that credited
	Consumer string `json:"consumer"` // the consumer that credited
	Balance  int64  `json:"balance"`  // the account's balance after the credit, in cents
}

// ledger names the hashes of the effect, on the stream's hash slot (a
// Redis Cluster runs the script on one node).
type ledger struct {
	executions string // "<payment> <execution>" -> consumer, one field per execution
	applied    string // payment -> number of executions (exactly once: 1)
	by         string // payment -> consumer that credited it (last)
	balances   string // account -> balance in cents
}

func ledgerOf(stream string) ledger {
	p := "ledger:{" + stream + "}:"
	return ledger{executions: p + "executions", applied: p + "applied", by: p + "by", balances: p + "balances"}
}

func (l ledger) keys() []string { return []string{l.executions, l.applied, l.by, l.balances} }

// creditScript is the side effect: it credits the account with the
// amount, once per execution. A go-redis resend of the script (after a
// read timeout) finds its execution recorded and credits nothing; another
// execution, in this consumer or another, credits again: that is what
// idem prevents, and what the ledger counts.
//
//	KEYS: executions, applied, by, balances
//	ARGV: payment, execution, consumer, account, amount
//	returns the account's balance
var creditScript = redis.NewScript(`
if redis.call('HSETNX', KEYS[1], ARGV[1] .. ' ' .. ARGV[2], ARGV[3]) == 1 then
  redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
  redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
  redis.call('HINCRBY', KEYS[4], ARGV[4], ARGV[5])
end
return tonumber(redis.call('HGET', KEYS[4], ARGV[4]) or '0')
`)

// creditAttempts bounds the attempts of one execution's credit (each one
// a go-redis command with its own retry).
const creditAttempts = 3

// credit runs creditScript for e, named by idem's lease token (unique per
// execution), and returns the result to store.
func (w *worker) credit(ctx context.Context, e entry) ([]byte, error) {
	execution := randomHex(8) // -unprotected: no lease
	if info, ok := idem.FromContext(ctx); ok && info.Protected {
		execution = info.Owner
	}
	// The script is safe to send again under the same execution: a retry
	// after a timeout (whose first attempt may have credited) credits at
	// most once. Giving up returns an error, which releases the key: if an
	// attempt did credit, the next execution credits again (the window
	// described in the package's doc).
	var balance int64
	var err error
	for attempt := 1; attempt <= creditAttempts; attempt++ {
		balance, err = creditScript.Run(ctx, w.rdb, ledgerOf(w.stream).keys(), e.payment, execution, w.name, e.account, e.amount).Int64()
		if err == nil || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("credit: %w", err)
	}
	return json.Marshal(credited{Entry: e.id, Consumer: w.name, Balance: balance})
}

// pauser holds a consumer at a point, for a test to kill it there.
type pauser struct {
	mu    sync.Mutex
	at    string
	after int // passes left before holding
	file  string
	until <-chan struct{} // the stop signal
	done  bool
}

// hold writes "<entry id> <payment id>" to p.file and waits for the stop
// signal, the first time it is called at p.at after p.after passes.
func (p *pauser) hold(_ context.Context, point string, e entry) error {
	p.mu.Lock()
	if point != p.at || p.done {
		p.mu.Unlock()
		return nil
	}
	if p.after > 0 {
		p.after--
		p.mu.Unlock()
		return nil
	}
	p.done = true
	p.mu.Unlock()
	if p.file != "" {
		// Written whole, then renamed: a reader never sees half of it.
		tmp := p.file + ".tmp"
		if err := os.WriteFile(tmp, []byte(e.id+" "+e.payment+"\n"), 0o644); err != nil {
			return err
		}
		if err := os.Rename(tmp, p.file); err != nil {
			return err
		}
	}
	<-p.until
	return nil
}

// produceCmd adds o.produce payments to the stream.
func produceCmd(o options, out io.Writer) error {
	rdb := newClient(o.redis)
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	entries, err := produce(ctx, rdb, o.stream, "pay-"+randomHex(4), o.produce, func(i int) bool { return i%10 == 0 })
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "produced %d payments in %d entries on %s (every tenth sent twice, as a producer retrying an XADD)\n", o.produce, entries, o.stream)
	return nil
}

// payment is what a producer sends.
type payment struct {
	id, account string
	amount      int64
}

// paymentN is the n-th payment (from 1) of a run named prefix.
func paymentN(prefix string, n int) payment {
	return payment{
		id:      fmt.Sprintf("%s-%05d", prefix, n),
		account: "acct-" + strconv.Itoa(1+n%3),
		amount:  int64(500 + (n*739)%4500),
	}
}

// produce adds payments 1..n of the run prefix to stream, those for which
// twice reports true twice (a producer retrying an XADD it got no reply
// to), and returns the number of entries added.
func produce(ctx context.Context, rdb *redis.Client, stream, prefix string, n int, twice func(int) bool) (int, error) {
	entries := 0
	for i := 1; i <= n; i++ {
		p := paymentN(prefix, i)
		times := 1
		if twice(i) {
			times = 2
		}
		for range times {
			err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []string{
				"id", p.id, "account", p.account, "amount", strconv.FormatInt(p.amount, 10),
			}}).Err()
			if err != nil {
				return entries, fmt.Errorf("XADD: %w", err)
			}
			entries++
		}
	}
	return entries, nil
}

// cents formats an amount in cents.
func cents(c int64) string {
	sign := ""
	if c < 0 {
		sign, c = "-", -c
	}
	return fmt.Sprintf("%s%d.%02d", sign, c/100, c%100)
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
