package redisstore_test

import "github.com/idemkit/idem/internal/slowclock"

// timed runs f and returns how long it took and how late the machine's
// timers fired meanwhile (see slowclock.Timed).
var timed = slowclock.Timed
