package main

import (
	"testing"

	"github.com/idemkit/idem/examples/internal/demo/demotest"
)

// TestDemo runs what `go run ./examples/echo -demo` runs, on the memory
// store and on Redis.
func TestDemo(t *testing.T) { demotest.Run(t, newServer) }

// TestREADMETranscript: the transcript in the README is what the demo
// prints (its keys' run id and the server's address aside, which the README
// fixes).
func TestREADMETranscript(t *testing.T) { demotest.CheckREADME(t, newServer) }
