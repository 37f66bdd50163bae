package main

import (
	"io"
	"regexp"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/redistest"
)

// TestDemo runs what `go run ./examples/grpc -demo` runs, on the memory
// store and on a real Redis (twice there, as two runs against one Redis
// are: each with keys of its own), and checks the transcript: the order
// ran once and was replayed, the double call's second call got Aborted
// and then the first's answer, the key reused for another order was
// refused once.
func TestDemo(t *testing.T) {
	for _, tc := range []struct {
		name  string
		redis bool
		runs  int
	}{{"memory", false, 1}, {"redis", true, 2}} {
		t.Run(tc.name, func(t *testing.T) {
			addr := ""
			if tc.redis {
				addr = redistest.Addr(t)
			}
			for range tc.runs {
				var out strings.Builder
				if err := run("", addr, true, &out, io.Discard); err != nil {
					t.Fatalf("%v\n%s", err, out.String())
				}
				checkTranscript(t, out.String())
			}
		})
	}
}

// checkTranscript requires each step of the demo, in order, as the
// transcript shows it.
func checkTranscript(t *testing.T, got string) {
	t.Helper()
	want := []string{
		`# an order: the handler runs\n` +
			`\$ Create idempotency-key: order-1-[0-9a-f]{8}  \{"amount":12,"item":"book"\}\n` +
			`attempt 1: OK\n` +
			`OK  order-id: 1\n` +
			`\{"amount":12,"handler_runs":1,"item":"book","order":1\}\n\n`,
		`# the client sends it again \(the answer was lost, say\): replayed, the handler does not run\n` +
			`\$ Create idempotency-key: order-1-[0-9a-f]{8}  \{"amount":12,"item":"book"\}\n` +
			`attempt 1: OK\n` +
			`OK  order-id: 1  idempotent-replayed: true\n` +
			`\{"amount":12,"handler_runs":1,"item":"book","order":1\}\n\n`,
		`# a double call, the first: the handler runs\n` +
			`\$ Create idempotency-key: order-2-[0-9a-f]{8}  \{"amount":3,"item":"pen"\}\n` +
			`attempt 1: OK\n` +
			`OK  order-id: 2\n` +
			`\{"amount":3,"handler_runs":2,"item":"pen","order":2\}\n\n`,
		`# a double call, the second, sent while the first ran: Aborted, then replayed\n` +
			`\$ Create idempotency-key: order-2-[0-9a-f]{8}  \{"amount":3,"item":"pen"\}\n` +
			`attempt 1: Aborted, retry-after: 1: the client waits, then retries with the same key\n` +
			`attempt 2: OK\n` +
			`OK  order-id: 2  idempotent-replayed: true\n` +
			`\{"amount":3,"handler_runs":2,"item":"pen","order":2\}\n\n`,
		`# the first key with another order: refused, never retried\n` +
			`\$ Create idempotency-key: order-1-[0-9a-f]{8}  \{"amount":99,"item":"book"\}\n` +
			`attempt 1: FailedPrecondition\n` +
			`FailedPrecondition IDEMPOTENCY_KEY_REUSED: This idempotency key was already used with a different request.\n\n$`,
	}
	re := regexp.MustCompile(`^` + strings.Join(want, ""))
	if !re.MatchString(got) {
		t.Errorf("the transcript is not the promised one:\n%s", got)
	}
}
