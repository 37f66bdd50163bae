package pgstore

// WithClock makes the store's statements read the clock from the SQL
// expression expr instead of clock_timestamp(): a function of the test's
// that returns a time the test moves.
func WithClock(expr string) Option { return func(c *config) { c.clock = expr } }
