package main

import (
	"testing"

	"github.com/idemkit/idem/internal/leakcheck"
)

// TestMain fails the run if a test leaves a goroutine behind.
func TestMain(m *testing.M) { leakcheck.Main(m) }
