package main

import (
	"os"
	"testing"

	"github.com/idemkit/idem/internal/leakcheck"
	"github.com/idemkit/idem/internal/redistest"
)

// TestMain fails the run if a test leaves a goroutine behind, stops the
// shared redis-server and removes the consumer binary.
func TestMain(m *testing.M) { leakcheck.Main(cleanup{redistest.Wrap(m)}) }

// cleanup removes the consumer binary after the tests.
type cleanup struct{ m leakcheck.M }

func (c cleanup) Run() int {
	defer func() {
		if build.dir != "" {
			os.RemoveAll(build.dir)
		}
	}()
	return c.m.Run()
}
