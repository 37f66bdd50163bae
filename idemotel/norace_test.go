//go:build !race

package idemotel_test

const raceEnabled = false
