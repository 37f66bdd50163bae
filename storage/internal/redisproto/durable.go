package redisproto

import (
	"fmt"
	"strconv"
	"time"

	"github.com/idemkit/idem/storage"
)

// DefaultDurableTimeout is how long a Complete waits for the durability
// it asks for when [Durability.Timeout] is 0.
const DefaultDurableTimeout = 100 * time.Millisecond

// Durability is what a store's Complete waits for once it wrote the done
// entry: Redis replicates asynchronously, so a primary that fails after
// the write and before a replica has it loses the record, and the retry
// runs again. The wait is sent on the connection that wrote (WAIT and
// WAITAOF count that connection's writes), and its timeout is the
// server's: the answer is not held longer.
type Durability struct {
	// Replicas is how many replicas must have the write (WAIT Replicas
	// timeout); 0 waits for none.
	Replicas int
	// AOF also waits until the primary has written the write to its
	// append-only file and fsynced it, and each of Replicas replicas to
	// theirs (WAITAOF 1 Replicas timeout: Redis 7.2 and newer, Valkey
	// 8.0 and newer), instead of WAIT. The primary must run with
	// appendonly yes (and the replicas, for Replicas > 0).
	AOF bool
	// Timeout bounds the wait, [DefaultDurableTimeout] when 0 (rounded up
	// to whole milliseconds).
	Timeout time.Duration
}

// On reports whether Complete waits at all.
func (d Durability) On() bool { return d.Replicas > 0 || d.AOF }

// Command returns the wait to send after the write: WAIT Replicas ms, or
// WAITAOF 1 Replicas ms.
func (d Durability) Command() []string {
	timeout := d.Timeout
	if timeout <= 0 {
		timeout = DefaultDurableTimeout
	}
	ms := strconv.FormatInt(Millis(timeout), 10)
	n := strconv.Itoa(max(d.Replicas, 0))
	if d.AOF {
		return []string{"WAITAOF", "1", n, ms}
	}
	return []string{"WAIT", n, ms}
}

// Check reads the answer to [Durability.Command] (err: the error that
// stood in for it): nil when the write is where it was to be waited for,
// and otherwise an error wrapping [storage.ErrNotDurable] that says what
// was confirmed. The write itself stands either way: a wait that failed
// (a network error, a server that does not know WAITAOF or runs without
// an append-only file) is not confirmed either.
func (d Durability) Check(r Reply, err error) error {
	if err != nil {
		return fmt.Errorf("%w: %s: %w", storage.ErrNotDurable, d.Command()[0], err)
	}
	switch {
	case !d.AOF && r.Kind == Int:
		if r.Int >= int64(d.Replicas) {
			return nil
		}
		return fmt.Errorf("%w: %d of %d replicas acknowledged the write within %sms", storage.ErrNotDurable, r.Int, d.Replicas, d.Command()[2])
	case d.AOF && r.Kind == Array && len(r.Array) == 2 && r.Array[0].Kind == Int && r.Array[1].Kind == Int:
		local, replicas := r.Array[0].Int, r.Array[1].Int
		if local >= 1 && replicas >= int64(d.Replicas) {
			return nil
		}
		return fmt.Errorf("%w: fsynced to the append-only file of %d primary and %d of %d replicas within %sms",
			storage.ErrNotDurable, local, replicas, d.Replicas, d.Command()[3])
	}
	return fmt.Errorf("%w: %s: %w", storage.ErrNotDurable, d.Command()[0], Unexpected(r))
}
