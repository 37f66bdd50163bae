package consumerkill

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// group is the consumer group of every test.
const group = "ledger"

// The ledger's hashes, as examples/consumer documents them.
func creditsKey(stream string) string  { return "ledger:{" + stream + "}:credits" }
func balancesKey(stream string) string { return "ledger:{" + stream + "}:balances" }

// payment is what a stream entry carries.
type payment struct {
	id, account string
	amount      int64 // cents
}

// ledger is what a stream, its group and its ledger hold.
type ledger struct {
	payments    map[string]payment  // by id, from the stream's entries
	credits     map[string][]string // payment id -> the consumer of each credit, sorted
	balances    map[string]int64    // account -> cents
	pending     int64               // entries delivered and not acked
	undelivered bool                // the group has not been given the last entry
}

// readLedger reads the entries of stream, the state of its group and its
// ledger.
func readLedger(ctx context.Context, rdb *redis.Client, stream string) (ledger, error) {
	l := ledger{payments: map[string]payment{}, credits: map[string][]string{}, balances: map[string]int64{}}
	msgs, err := rdb.XRange(ctx, stream, "-", "+").Result()
	if err != nil {
		return l, err
	}
	for _, m := range msgs {
		p := paymentOf(m)
		if _, dup := l.payments[p.id]; !dup {
			l.payments[p.id] = p
		}
	}
	credits, err := rdb.HGetAll(ctx, creditsKey(stream)).Result()
	if err != nil {
		return l, err
	}
	for field, consumer := range credits { // "<payment id> <execution>" -> consumer
		id, _, _ := strings.Cut(field, " ")
		l.credits[id] = append(l.credits[id], consumer)
	}
	for _, by := range l.credits {
		slices.Sort(by)
	}
	balances, err := rdb.HGetAll(ctx, balancesKey(stream)).Result()
	if err != nil {
		return l, err
	}
	for a, b := range balances {
		if l.balances[a], err = strconv.ParseInt(b, 10, 64); err != nil {
			return l, fmt.Errorf("balance of %s: %w", a, err)
		}
	}
	groups, err := rdb.XInfoGroups(ctx, stream).Result()
	if err != nil {
		return l, err
	}
	i := slices.IndexFunc(groups, func(g redis.XInfoGroup) bool { return g.Name == group })
	if i < 0 {
		return l, fmt.Errorf("no group %s on %s", group, stream)
	}
	l.pending = groups[i].Pending
	l.undelivered = len(msgs) > 0 && groups[i].LastDeliveredID != msgs[len(msgs)-1].ID
	return l, nil
}

// paymentOf is the payment of a stream entry.
func paymentOf(m redis.XMessage) payment {
	p := payment{}
	p.id, _ = m.Values["id"].(string)
	p.account, _ = m.Values["account"].(string)
	amount, _ := m.Values["amount"].(string)
	p.amount, _ = strconv.ParseInt(amount, 10, 64)
	return p
}

// credited returns the number of credits counted.
func (l ledger) credited() int {
	n := 0
	for _, by := range l.credits {
		n += len(by)
	}
	return n
}

// problems lists what breaks "every payment credited exactly once and
// every entry acked": a payment credited another number of times than
// once, a credit of a payment not in the stream, a balance that is not the
// sum of its account's payments, entries pending or not delivered. It
// lists at most 10 payments.
func (l ledger) problems() []string {
	var ps []string
	ids := slices.Sorted(maps.Keys(l.payments))
	want := map[string]int64{}
	wrong := 0
	for _, id := range ids {
		p := l.payments[id]
		want[p.account] += p.amount
		if n := len(l.credits[id]); n != 1 {
			if wrong++; wrong <= 10 {
				ps = append(ps, fmt.Sprintf("payment %s credited %d times (by %v), want once", id, n, l.credits[id]))
			}
		}
	}
	if wrong > 10 {
		ps = append(ps, fmt.Sprintf("and %d more payments not credited once", wrong-10))
	}
	for id := range l.credits {
		if _, ok := l.payments[id]; !ok {
			ps = append(ps, fmt.Sprintf("payment %s credited, not in the stream", id))
		}
	}
	for a, w := range want {
		if got := l.balances[a]; got != w {
			ps = append(ps, fmt.Sprintf("account %s: balance %d, want %d (the sum of its payments)", a, got, w))
		}
	}
	if l.pending != 0 {
		ps = append(ps, fmt.Sprintf("entries pending (delivered, not acked): %d", l.pending))
	}
	if l.undelivered {
		ps = append(ps, "entries not delivered to the group")
	}
	slices.Sort(ps)
	return ps
}

// checkLedger fails the test unless every payment of stream was credited
// exactly once and every entry acked, and returns the ledger.
func checkLedger(t *testing.T, rdb *redis.Client, stream string) ledger {
	t.Helper()
	l, err := readLedger(t.Context(), rdb, stream)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range l.problems() {
		t.Error(p)
	}
	return l
}

// TestLedgerCheck runs the ledger's check on ledgers made by hand, on
// miniredis: a good one passes; one with a payment credited twice (what
// a consumer that credits without Do leaves after a redelivery), one with
// a payment never credited, a wrong balance or an entry not acked fail,
// each for its reason.
func TestLedgerCheck(t *testing.T) {
	for _, tc := range []struct {
		name    string
		credits []string // "<payment> <execution> <consumer>"
		balance int64    // of acct-1
		ackAll  bool
		want    []string
	}{
		{"good", []string{"p1 e1 c1", "p2 e2 c1"}, 300, true, nil},
		{"double credit", []string{"p1 e1 c1", "p2 e2 c1", "p2 e3 c2"}, 500, true, []string{
			"account acct-1: balance 500, want 300 (the sum of its payments)",
			"payment p2 credited 2 times (by [c1 c2]), want once",
		}},
		{"resent", []string{"p1 e1 c1", "p2 e2 c1", "p2 e2 c1"}, 300, true, nil}, // one field: one credit
		{"missing credit", []string{"p1 e1 c1"}, 100, true, []string{
			"account acct-1: balance 100, want 300 (the sum of its payments)",
			"payment p2 credited 0 times (by []), want once",
		}},
		{"unknown payment", []string{"p1 e1 c1", "p2 e2 c1", "p9 e9 c1"}, 300, true, []string{
			"payment p9 credited, not in the stream",
		}},
		{"not acked", []string{"p1 e1 c1", "p2 e2 c1"}, 300, false, []string{"entries pending (delivered, not acked): 1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mr := miniredis.RunT(t)
			rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
			defer rdb.Close()
			ctx := t.Context()
			stream := "s"
			// p1 once, p2 twice (a producer's retry), all of acct-1.
			for _, p := range []payment{{"p1", "acct-1", 100}, {"p2", "acct-1", 200}, {"p2", "acct-1", 200}} {
				if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"id", p.id, "account", p.account, "amount", p.amount}}).Err(); err != nil {
					t.Fatal(err)
				}
			}
			if err := rdb.XGroupCreate(ctx, stream, group, "0").Err(); err != nil {
				t.Fatal(err)
			}
			read, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: "c1", Streams: []string{stream, ">"}}).Result()
			if err != nil {
				t.Fatal(err)
			}
			msgs := read[0].Messages
			if !tc.ackAll {
				msgs = msgs[1:]
			}
			for _, m := range msgs {
				rdb.XAck(ctx, stream, group, m.ID)
			}
			for _, c := range tc.credits {
				f := strings.Fields(c)
				rdb.HSet(ctx, creditsKey(stream), f[0]+" "+f[1], f[2])
			}
			rdb.HSet(ctx, balancesKey(stream), "acct-1", tc.balance)

			l, err := readLedger(ctx, rdb, stream)
			if err != nil {
				t.Fatal(err)
			}
			if got := l.problems(); !slices.Equal(got, tc.want) {
				t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}
