package main

import (
	"testing"

	"github.com/idemkit/idem/internal/pgtest"
	"go.uber.org/goleak"
)

// TestMain fails the run if a test leaves a goroutine behind, and stops
// the PostgreSQL server that internal/pgtest started for the tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(pgtest.Wrap(m)) }
