//go:build unix

package e2e

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// The helpers of this file let a test tell a broken guarantee from a
// machine too loaded for the test's margins to hold: a lease of a second
// or two that real processes renew on a real clock, or a step that must
// come before a lease runs out. The tests measure what the machine took
// and, where a margin was exceeded, skip the comparison that depended on
// it (with t.Skip, saying why) rather than fail it or pass it silently.

// stallDuring waits d and returns the longest the machine kept the test
// and Redis away meanwhile: the test pings rdb every `every` and measures
// the time between two answers, less the pause it meant. A process that
// renews a lease on a real clock runs on the same machine: when a renewal
// came too late, a stall this long says why.
func stallDuring(ctx context.Context, rdb *redis.Client, d, every time.Duration) time.Duration {
	end := time.Now().Add(d)
	last := time.Now()
	var worst time.Duration
	for {
		left := time.Until(end)
		if left <= 0 || !sleep(ctx, min(every, left)) {
			return worst
		}
		rdb.Ping(ctx) // its error is a stall too: it ends at its timeout
		now := time.Now()
		worst = max(worst, now.Sub(last)-every)
		last = now
	}
}

// outageMargin is how long an outage of the store may last for the
// processes (see outage.lasted) for the middleware's renewals, and its
// retries of a record, to be sure to get through before a lease ends:
// between two renewals a lease has two thirds of itself left, of which
// lease/12 is kept for the retries' spacing (at most lease/20) on a
// loaded machine.
func outageMargin(lease time.Duration) time.Duration { return lease*2/3 - lease/12 }
