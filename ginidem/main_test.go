package ginidem_test

import (
	"testing"

	"github.com/idemkit/idem/internal/leakcheck"
)

// TestMain fails the run if a goroutine leaked (a lease heartbeat, a
// store's janitor). The conformance suite, on every store, runs this
// adapter in internal/tests/ginidem.
func TestMain(m *testing.M) { leakcheck.Main(m) }
