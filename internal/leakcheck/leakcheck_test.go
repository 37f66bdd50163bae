package leakcheck

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

type runFunc func() int

func (f runFunc) Run() int { return f() }

// TestNothingLeftWhileTestsRun: inside a test, the testing package's own
// goroutines (the main one, blocked in (*T).Run) are not reported. It
// waits as Main does: the main goroutine may still be runnable, on its way
// to block in (*T).Run, when the test starts (Leaked(0) reported it in
// 113 of 3,000 runs under -race, and once in CI).
func TestNothingLeftWhileTestsRun(t *testing.T) {
	if left := Leaked(time.Second); len(left) != 0 {
		t.Fatalf("reported:\n%s", strings.Join(left, "\n\n"))
	}
}

// parked blocks until release is closed; its name is what the report must
// show.
func parked(release <-chan struct{}, done chan<- struct{}) {
	<-release
	close(done)
}

// TestLeftGoroutineFailsARun: a passing run that leaves a goroutine behind
// exits 1 and prints the goroutine's stack; a failing run keeps its own
// code.
func TestLeftGoroutineFailsARun(t *testing.T) {
	release, done := make(chan struct{}), make(chan struct{})
	defer func() { close(release); <-done }()
	var out bytes.Buffer
	code := run(runFunc(func() int {
		go parked(release, done)
		return 0
	}), &out, 20*time.Millisecond)
	if code != 1 {
		t.Fatalf("exit code %d, want 1", code)
	}
	if s := out.String(); !strings.Contains(s, "leakcheck: 1 goroutines left") || !strings.Contains(s, "leakcheck.parked") {
		t.Fatalf("report does not name the goroutine:\n%s", s)
	}
	out.Reset()
	if code := run(runFunc(func() int { return 3 }), &out, 0); code != 3 || out.Len() != 0 {
		t.Fatalf("failing run: code %d, output %q", code, out.String())
	}
}

// TestGoroutineOnItsWayOutIsWaitedFor: a goroutine that ends after the run
// returned, within the wait, is not a leak.
func TestGoroutineOnItsWayOutIsWaitedFor(t *testing.T) {
	var out bytes.Buffer
	code := run(runFunc(func() int {
		release, done := make(chan struct{}), make(chan struct{})
		go parked(release, done)
		go close(release) // parked ends a moment later, after Run returned
		return 0
	}), &out, Wait)
	if code != 0 {
		t.Fatalf("exit code %d:\n%s", code, out.String())
	}
}

// TestParse reads the head and the functions of a goroutine.
func TestParse(t *testing.T) {
	s := parse("goroutine 7 [chan receive, 2 minutes]:\n" +
		"testing.(*T).Run(0xc000003a00, {0x5f1e2b, 0x4}, 0x60c8d8)\n" +
		"\t/usr/local/go/src/testing/testing.go:1751 +0x3ab\n" +
		"created by testing.runTests in goroutine 1\n" +
		"\t/usr/local/go/src/testing/testing.go:2161 +0x37")
	if s.state != "chan receive, 2 minutes" || s.first() != "testing.(*T).Run" || !s.has("testing.runTests") || s.has("testing.tRunner") {
		t.Fatalf("parsed %+v", s)
	}
	if !ignore(s) {
		t.Fatal("the testing package's goroutine is not ignored")
	}
	if ignore(parse("goroutine 9 [select]:\nmain.janitor(...)\n\t/x.go:1 +0x1")) {
		t.Fatal("a janitor is ignored")
	}
}
