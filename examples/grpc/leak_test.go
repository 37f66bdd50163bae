package main

import (
	"testing"

	"github.com/idemkit/idem/internal/leakcheck"
	"github.com/idemkit/idem/internal/redistest"
)

// TestMain fails the run if a test leaves a goroutine behind, and stops
// the shared redis-server.
func TestMain(m *testing.M) { leakcheck.Main(redistest.Wrap(m)) }
