// Command consumer is a Redis Streams consumer-group worker that credits
// each payment once with idem's Middleware.Do, also when a consumer dies
// in the middle of an entry and another one claims it.
//
//	go run ./examples/consumer                                     # the demo, on an in-process miniredis; prints a ledger
//	go run ./examples/consumer -demo -redis localhost:6379         # the same demo on a real Redis
//	go run ./examples/consumer -redis localhost:6379 -consumer c1  # a worker, until SIGTERM or SIGINT
//	redis-cli XADD payments '*' id pay-1 account acct-1 amount 1250  # a payment for it
//
// Each entry of the stream is a payment: fields id (the payment's id, set
// by the producer), account and amount (in cents). A worker joins the
// group, reads back first the entries pending under its own name (read and
// not acked before a restart), then loops: XAUTOCLAIM the entries idle for
// longer than -min-idle (a dead consumer's), XREADGROUP new ones. For each
// entry it calls
//
//	m.Do(ctx, stream+"/"+group, payment id, credit)
//
// and then XACKs the entry when Do returned a result (the credit ran now,
// or ran before and Do replays its result) or an error that no redelivery
// mends (ErrNotReplayable, an invalid entry). After ErrConflict (another
// consumer is crediting the payment) or another error, the entry stays
// pending and XAUTOCLAIM brings it back. The key is the payment's id, not
// the entry's: a producer that retries an XADD adds a second entry for the
// same payment.
//
// The credit is a Lua script that records its execution (idem's lease
// token, Info.Owner) with the credit, so that a script go-redis sends again
// after a timeout credits once. The ledger is two hashes on the stream's
// hash slot:
//
//	ledger:{<stream>}:credits   "<payment id> <execution>" -> consumer, a field per credit
//	ledger:{<stream>}:balances  account -> balance in cents
//
// On SIGTERM or SIGINT the worker finishes the entry in hand (its credit
// and XACK), leaves the rest pending, and waits in Middleware.Shutdown for
// the records still being stored. What is left: a consumer killed between
// the credit and Do's record of it (one round trip) has the payment
// credited again once its lease expires (see "Queue consumers" in
// docs/manual.md).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/redis/go-redis/v9"
)

func main() {
	host, _ := os.Hostname()
	addr := flag.String("redis", "", "Redis address (host:port); without it: the demo on an in-process miniredis")
	demo := flag.Bool("demo", false, "run the demo (on -redis when given): crash a consumer, let others claim, print the ledger, exit")
	w := &worker{}
	flag.StringVar(&w.stream, "stream", "payments", "stream name")
	flag.StringVar(&w.group, "group", "ledger", "consumer group name")
	flag.StringVar(&w.name, "consumer", host+"-"+strconv.Itoa(os.Getpid()), "consumer name; keep it across restarts, to read back its own pending entries")
	flag.DurationVar(&w.minIdle, "min-idle", 30*time.Second, "claim (XAUTOCLAIM) the entries pending for longer than this; at least -lease")
	lease := flag.Duration("lease", 10*time.Second, "idem's lease: how long a dead consumer's payment stays locked")
	ttl := flag.Duration("ttl", 24*time.Hour, "how long a payment's result is kept: a duplicate within it is not credited again")
	flag.DurationVar(&w.block, "block", 2*time.Second, "XREADGROUP BLOCK: how long a stop may wait, and how often an idle worker claims")
	flag.Int64Var(&w.count, "count", 10, "entries per XREADGROUP and XAUTOCLAIM")
	flag.Parse()

	var err error
	if *addr == "" || *demo {
		err = runDemo(*addr, os.Stdout)
	} else {
		err = consume(w, *addr, *lease, *ttl)
	}
	if err != nil {
		log.Fatal(err)
	}
}

// consume runs w on the Redis at addr until SIGTERM or SIGINT, then shuts
// it down. It logs to stdout.
func consume(w *worker, addr string, lease, ttl time.Duration) error {
	w.rdb = redis.NewClient(redisstore.ClientOptions(addr))
	defer w.rdb.Close()
	var err error
	if w.m, err = idem.New(redisstore.New(w.rdb), idem.WithLease(lease), idem.WithTTL(ttl)); err != nil {
		return err
	}
	w.log = slog.New(slog.NewTextHandler(os.Stdout, nil)).With("consumer", w.name)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// On the signal: run finishes the entry in hand, then returns.
	stopping := context.AfterFunc(ctx, func() { w.log.Info("stopping") })
	w.log.Info("consuming", "stream", w.stream, "group", w.group, "min_idle", w.minIdle, "lease", lease)
	runErr := w.run(ctx)
	stopping()
	stop() // a second signal kills the process
	sctx, cancel := context.WithTimeout(context.Background(), lease)
	defer cancel()
	if err := w.m.Shutdown(sctx); err != nil {
		return err
	}
	w.log.Info("stopped", "records", "stored")
	if errors.Is(runErr, context.Canceled) {
		return nil
	}
	return runErr
}

// worker is one consumer of the group.
type worker struct {
	rdb                 *redis.Client
	m                   *idem.Middleware
	log                 *slog.Logger // a line per entry: msg=entry
	stream, group, name string
	minIdle, block      time.Duration
	count               int64
}

// run consumes until ctx ends. The entry in hand then is finished (credit
// and XACK); the rest of its batch stays pending.
func (w *worker) run(ctx context.Context) error {
	if err := w.join(ctx); err != nil {
		return err
	}
	for start := "0"; ctx.Err() == nil; { // this consumer's own pending entries
		msgs, err := w.read(ctx, start, -1)
		if err != nil {
			return err
		}
		if len(msgs) == 0 {
			break
		}
		w.handleAll(ctx, msgs, "history")
		start = msgs[len(msgs)-1].ID
	}
	for cursor := "0-0"; ctx.Err() == nil; {
		claimed, next, err := w.rdb.XAutoClaim(ctx, &redis.XAutoClaimArgs{Stream: w.stream, Group: w.group,
			Consumer: w.name, MinIdle: w.minIdle, Start: cursor, Count: w.count}).Result()
		if err == nil {
			cursor = next
			w.handleAll(ctx, claimed, "claim")
			var msgs []redis.XMessage
			if msgs, err = w.read(ctx, ">", w.block); err == nil {
				w.handleAll(ctx, msgs, "read")
			}
		}
		if err != nil && ctx.Err() == nil { // Redis failed, or the group was deleted
			w.log.Error("redis", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(w.block):
			}
			w.join(ctx)
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

// read is XREADGROUP from start: ">" for new entries, waiting up to block;
// an id for this consumer's own pending entries after it, with block < 0.
func (w *worker) read(ctx context.Context, start string, block time.Duration) ([]redis.XMessage, error) {
	streams, err := w.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: w.group, Consumer: w.name,
		Streams: []string{w.stream, start}, Count: w.count, Block: block}).Result()
	switch {
	case errors.Is(err, redis.Nil): // BLOCK timed out
		return nil, nil
	case err != nil:
		return nil, err
	case len(streams) == 0:
		return nil, nil
	}
	return streams[0].Messages, nil
}

// handleAll handles msgs in order until ctx ends. The entry in hand is
// finished whatever ctx does: its credit and XACK do not stop half-way.
func (w *worker) handleAll(ctx context.Context, msgs []redis.XMessage, via string) {
	for _, msg := range msgs {
		if ctx.Err() != nil {
			return
		}
		w.handle(context.WithoutCancel(ctx), msg, via)
	}
}

// errInvalid marks an entry that is not a payment.
var errInvalid = errors.New("not a payment")

// handle credits the payment of msg once, through Do, acks msg when that
// is settled, and logs how it ended.
func (w *worker) handle(ctx context.Context, msg redis.XMessage, via string) {
	p, err := parsePayment(msg)
	ran := false
	var res credited
	if err == nil {
		var b []byte
		b, err = w.m.Do(ctx, w.stream+"/"+w.group, p.id, func(ctx context.Context) ([]byte, error) {
			ran = true
			return w.credit(ctx, p)
		})
		json.Unmarshal(b, &res) // our own JSON; nil b (an error) leaves res empty
	}
	outcome, ack := "applied", true
	switch {
	case err == nil && !ran:
		outcome = "replayed" // credited before: the normal end of a redelivery
	case err == nil:
	case errors.Is(err, errInvalid), errors.Is(err, idem.ErrInvalidKey):
		outcome = "rejected" // no redelivery would mend it
	case errors.Is(err, idem.ErrNotReplayable):
		outcome = "lost" // credited before, its result not kept
	case errors.Is(err, idem.ErrConflict):
		outcome, ack = "conflict", false // in flight elsewhere: claimed again later
	default:
		outcome, ack = "failed", false // store or credit failed, key released: claimed again later
	}
	if ack {
		if aerr := w.rdb.XAck(ctx, w.stream, w.group, msg.ID).Err(); aerr != nil {
			ack, err = false, errors.Join(err, fmt.Errorf("XACK: %w", aerr))
		}
	}
	attrs := []any{"entry", msg.ID, "payment", p.id, "via", via, "outcome", outcome}
	if res.Consumer != "" {
		attrs = append(attrs, "by", res.Consumer, "balance", res.Balance)
	}
	attrs = append(attrs, "acked", ack)
	if err != nil {
		attrs = append(attrs, "err", err)
	}
	w.log.Info("entry", attrs...)
}

// payment is a stream entry's payment.
type payment struct {
	id, account string
	amount      int64 // cents
}

// parsePayment reads the payment of msg; the error wraps errInvalid.
func parsePayment(msg redis.XMessage) (payment, error) {
	var p payment
	p.id, _ = msg.Values["id"].(string)
	p.account, _ = msg.Values["account"].(string)
	amount, _ := msg.Values["amount"].(string)
	var err error
	if p.amount, err = strconv.ParseInt(amount, 10, 64); err != nil || p.id == "" || p.account == "" {
		return p, fmt.Errorf("%w: id %q, account %q, amount %q (or deleted from the stream)", errInvalid, p.id, p.account, amount)
	}
	return p, nil
}

// credited is the result Do stores for a payment, and replays.
type credited struct {
	Consumer string `json:"consumer"` // the consumer that credited
	Balance  int64  `json:"balance"`  // the account's balance after the credit, in cents
}

// ledgerKeys are the ledger's hashes, credits and balances, on the
// stream's hash slot (a Redis Cluster runs a script on one node).
func ledgerKeys(stream string) []string {
	return []string{"ledger:{" + stream + "}:credits", "ledger:{" + stream + "}:balances"}
}

// creditScript credits the account with the amount once per execution: a
// resend under the same execution credits nothing more. Another execution
// credits again: that is what Do prevents.
//
//	KEYS: credits, balances; ARGV: payment id, execution, consumer, account, amount
//	returns the account's balance
var creditScript = redis.NewScript(`
if redis.call('HSETNX', KEYS[1], ARGV[1] .. ' ' .. ARGV[2], ARGV[3]) == 1 then
  redis.call('HINCRBY', KEYS[2], ARGV[4], ARGV[5])
end
return tonumber(redis.call('HGET', KEYS[2], ARGV[4]))
`)

// credit runs creditScript for p, as the execution named by idem's lease
// token, and returns the result for Do to store.
func (w *worker) credit(ctx context.Context, p payment) ([]byte, error) {
	info, _ := idem.FromContext(ctx)
	balance, err := creditScript.Run(ctx, w.rdb, ledgerKeys(w.stream), p.id, info.Owner, w.name, p.account, p.amount).Int64()
	if err != nil {
		return nil, fmt.Errorf("credit: %w", err)
	}
	return json.Marshal(credited{Consumer: w.name, Balance: balance})
}
