package main

import (
	"testing"

	"github.com/idemkit/idem/internal/dynamotest"
	"github.com/idemkit/idem/internal/leakcheck"
)

// TestMain fails the run if a test leaves a goroutine behind, and stops
// the dynalite that internal/dynamotest started for the tests.
func TestMain(m *testing.M) { leakcheck.Main(dynamotest.Wrap(m)) }
