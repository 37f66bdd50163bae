//go:build !race

package idemclient

const raceEnabled = false
