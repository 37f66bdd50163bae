package main

import (
	"os"
	"testing"

	"github.com/idemkit/idem/internal/leakcheck"
	"github.com/idemkit/idem/internal/mysqltest"
)

// TestMain fails the run if a test leaves a goroutine behind, and stops
// the MariaDB server that internal/mysqltest started for the tests. Run
// with envChild set (by TestProcessKilledAfterCommit), the test binary is
// instead the service's process that the test kills.
func TestMain(m *testing.M) {
	if os.Getenv(envChild) != "" {
		os.Exit(child())
	}
	leakcheck.Main(mysqltest.Wrap(m))
}
