//go:build race

package idemclient

// raceEnabled: the race detector allocates on its own, so the allocation
// budget is not measured under it.
const raceEnabled = true
