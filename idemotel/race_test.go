//go:build race

package idemotel_test

// raceEnabled: the race detector allocates on its own, so allocation
// budgets are not measured under it.
const raceEnabled = true
