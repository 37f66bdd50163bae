package main

import (
	"testing"

	"github.com/idemkit/idem/examples/internal/demo/demotest"
)

// TestDemo runs what `go run ./examples/echo -demo` runs, on the memory
// store and on Redis.
func TestDemo(t *testing.T) { demotest.Run(t, newServer) }
