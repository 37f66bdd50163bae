package main

import (
	"testing"

	"github.com/idemkit/idem/internal/leakcheck"
	"github.com/idemkit/idem/internal/pgtest"
)

// TestMain fails the run if a test leaves a goroutine behind, and stops
// the PostgreSQL server that internal/pgtest started for the tests.
func TestMain(m *testing.M) { leakcheck.Main(pgtest.Wrap(m)) }
