package idemclient

import (
	"testing"

	"github.com/idemkit/idem/internal/leakcheck"
)

// TestMain fails the run if a test leaves a goroutine behind: a
// connection of a test server or client, or a wait that outlived its
// request.
func TestMain(m *testing.M) { leakcheck.Main(m) }
