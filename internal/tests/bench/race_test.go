//go:build race

package bench

// raceEnabled: the race detector allocates on its own and makes sync.Pool
// drop objects at random, so allocation budgets are not measured under it.
const raceEnabled = true
