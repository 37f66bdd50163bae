package pgstore_test

import (
	"context"
	"time"

	"github.com/idemkit/idem/internal/slowclock"
	"github.com/jackc/pgx/v5"
)

// leaseLog is slowclock's Store with the wrapped store's Fence: a test
// whose handler needs a short lease alive on a real clock, to Fence in
// it, tells a lease that ran out on a loaded machine (its renewals came
// late) from a broken one.
type leaseLog struct{ slowclock.Store }

// Fence is the wrapped store's (see dying.Fence).
func (l *leaseLog) Fence(ctx context.Context, tx pgx.Tx) error {
	return l.Store.Store.(interface {
		Fence(context.Context, pgx.Tx) error
	}).Fence(ctx, tx)
}

func (l *leaseLog) lapsed(d time.Duration, at time.Time) bool { return l.Lapsed(d, at) }

var inTime = slowclock.InTime
