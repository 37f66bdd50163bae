// Package consumerkill holds the process tests of examples/consumer, the
// Redis Streams consumer that credits each payment once with
// Middleware.Do. It has no code of its own.
//
// The tests build the example (go build, without -race) and run it as
// real processes on a real redis-server (internal/redistest: skipped
// without one, failed when IDEM_REQUIRE_REDIS=1), as a black box: its
// flags, its log (a line per entry, msg=entry), the stream and the ledger
// the example documents (ledger:{<stream>}:credits, a field
// "<payment id> <execution>" per credit, and ledger:{<stream>}:balances).
// To stop a consumer at a precise point they put a TCP proxy of their own
// between it and Redis that reads its RESP commands and holds one: the
// credit script's EVALSHA or EVAL for a given payment (the consumer is
// inside Do, holding the payment's key, and has credited nothing) or the
// XACK of a given entry (Do has returned, its result stored). When the
// proxy reports the command held, the test kills the consumer (SIGKILL)
// or stops it (SIGTERM) and releases the command.
//
//   - TestKillBeforeEffect: a consumer killed before its 4th credit, with
//     7 entries pending. The others claim its entries (XAUTOCLAIM), get
//     ErrConflict for the held payment while the dead consumer's lease
//     lasts, then credit it.
//   - TestKillAfterDo: a consumer killed at the XACK of its 4th entry: the
//     others claim the entry and Do replays the dead consumer's result.
//   - TestStopFinishesEntryInHand: SIGTERM while a consumer's credit is
//     held: it finishes that entry (credit and XACK), leaves the rest of
//     its batch pending and exits 0; started again under its name, it
//     reads them back first.
//   - TestRestartReadsOwnPending: a consumer killed at an XACK and started
//     again under its name reads its pending entries back first: the held
//     one replayed, the others credited.
//
// Each ends with the ledger checked: every payment of the stream credited
// exactly once, every balance the sum of its account's payments, every
// entry delivered and acked. TestLedgerCheck shows that this check fails
// on ledgers made by hand with a payment credited twice, one never
// credited, a wrong balance or an entry left pending.
package consumerkill
