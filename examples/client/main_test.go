package main

import (
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/idemkit/idem/examples/internal/demotest"
	"github.com/idemkit/idem/internal/tests/clientproc"
)

// TestRun runs what `go run ./examples/client` runs: the application of
// examples/nethttp in-process, on the memory store and on Redis (twice
// against one Redis, as two runs with -redis are), and checks what a user
// sees: every attempt and Result, the responses, and the handler run once
// per order.
func TestRun(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		out, log := runOnce(t, "")
		clientproc.CheckTranscript(t, out, 1)
		clientproc.CheckExecutions(t, log, 2)
	})
	t.Run("redis", func(t *testing.T) {
		mr := miniredis.RunT(t)
		for run := range 2 {
			out, log := runOnce(t, mr.Addr())
			clientproc.CheckTranscript(t, out, 1) // a new process: its handler_runs starts again
			clientproc.CheckExecutions(t, log, 2)
			if n, want := len(mr.Keys()), 2*(run+1); n != want {
				t.Errorf("Redis holds %d keys after %d runs, want %d (two orders per run): %v", n, run+1, want, mr.Keys())
			}
		}
	})
}

// runOnce runs the program without -addr (the application in-process on
// redisAddr's store, the memory store when empty) and returns its
// transcript and log; it fails the test if the program reports a failure.
func runOnce(t *testing.T, redisAddr string) (out, log string) {
	t.Helper()
	var o, l demotest.Buffer
	if err := run("", redisAddr, &o, &l); err != nil {
		t.Fatalf("run: %v\ntranscript:\n%s\nlog:\n%s", err, o.String(), l.String())
	}
	return o.String(), l.String()
}
