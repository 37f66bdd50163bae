package dynamotest

import (
	"testing"

	"github.com/idemkit/idem/internal/leakcheck"
)

// TestMain stops the shared server and fails the run if a goroutine leaked.
func TestMain(m *testing.M) { leakcheck.Main(Wrap(m)) }
