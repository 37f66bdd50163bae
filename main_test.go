package idem

import (
	"testing"

	"github.com/idemkit/idem/internal/leakcheck"
)

// TestMain fails the run if a test leaves a goroutine behind, such as a
// lease heartbeat that outlives its handler.
func TestMain(m *testing.M) { leakcheck.Main(m) }
