package clientproc

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The checks of examples/client's transcript, shared by its own test (in
// process) and this package's (as processes).

// CheckTranscript checks what the user sees; first is handler_runs of the
// first order of this run.
func CheckTranscript(t testing.TB, out string, first int) {
	t.Helper()
	order1 := fmt.Sprintf(`{"amount":12,"handler_runs":%d,"item":"book","order":%d}`, first, first)
	order2 := fmt.Sprintf(`{"amount":3,"handler_runs":%d,"item":"pen","order":%d}`, first+1, first+1)
	for _, want := range []string{
		// 1: the lost response, then its replay.
		"\n  attempt 1: error: simulated timeout: the server answered 201, the response was lost on the way back; retry in ",
		"\n  attempt 2: 201 Idempotent-Replayed: true\n  Result: attempts=2 replayed=true\n" +
			"HTTP 201  Idempotent-Replayed: true  Content-Type: application/json\n" + order1 +
			"\nthe lost response and the replay: the same bytes: true\n",
		// 2: the double click.
		"the call that ran the handler:\n  attempt 1: 201\n  Result: attempts=1 replayed=false\n",
		"the call that waited:\n  attempt 1: 409 Retry-After: 1; retry in 1", // 1s, or 1.xxxs: checked below
		"\n  attempt 2: 201 Idempotent-Replayed: true\n  Result: attempts=2 replayed=true\n" +
			"HTTP 201  Idempotent-Replayed: true  Content-Type: application/json\n" + order2 +
			"\nboth calls got the same bytes: true\n",
		// 3: the reused key.
		"\n  attempt 1: 422\n  Result: attempts=1 replayed=false\nHTTP 422  Content-Type: application/problem+json\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the transcript does not show %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "FAIL") {
		t.Errorf("the transcript reports a failure:\n%s", out)
	}
	// A Retry-After of 1 s is waited 1 s plus up to a tenth.
	if m := regexp.MustCompile(`409 Retry-After: 1; retry in (1\.\d+s|1s)\n`).FindStringSubmatch(out); m == nil {
		t.Errorf("no wait of 1 s to 1.1 s after the 409:\n%s", out)
	} else if d, err := time.ParseDuration(m[1]); err != nil || d > 1100*time.Millisecond {
		t.Errorf("waited %s after a Retry-After of 1 s, want at most 1.1s", m[1])
	}
}

// CheckExecutions checks that the server's log shows want executions (the
// handler ran once per order).
func CheckExecutions(t testing.TB, log string, want int) {
	t.Helper()
	if n := strings.Count(log, "-> executed 201"); n != want {
		t.Errorf("the server's log shows %d executions, want %d:\n%s", n, want, log)
	}
}
