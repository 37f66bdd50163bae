package grpcidem_test

import "github.com/idemkit/idem/internal/slowclock"

// leaseLog records when the middleware's lease was taken and renewed, so
// that a test that needs a short lease kept alive on a real clock tells a
// lease that ran out on a loaded machine from a broken renewal.
type leaseLog = slowclock.Store

var inTime = slowclock.InTime
