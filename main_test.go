package idem

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run if a test leaves a goroutine behind, such as a
// lease heartbeat that outlives its handler.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
