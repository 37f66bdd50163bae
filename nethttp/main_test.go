package nethttp_test

import (
	"testing"

	"github.com/idemkit/idem/internal/redistest"
)

// TestMain stops the redis-servers the conformance suite started and fails
// the run if a goroutine leaked (a lease heartbeat, a memstore janitor).
func TestMain(m *testing.M) { redistest.Main(m) }
