package dynamostore

import "time"

// WithClock makes the store read now instead of time.Now: the tests'
// clock, moved by the contract suite's Advance.
func WithClock(now func() time.Time) Option { return func(c *config) { c.now = now } }
