// Package leakcheck fails a test binary that leaves goroutines behind: a
// lease heartbeat nobody stopped, a store's janitor without its Close, a
// connection's read loop. It is the kit's own small form of
// go.uber.org/goleak's VerifyTestMain, with the same default filters, so
// that the core module requires no third-party module, not even for its
// tests: `go mod tidy` in a program that imports only the core then
// downloads nothing (tidy fetches the modules that the tests of every
// imported package need).
package leakcheck

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"time"
)

// M is what a TestMain runs: *testing.M, or an M wrapped by
// internal/redistest or internal/pgtest.
type M interface{ Run() int }

// Wait is how long Main lets goroutines that are already on their way out
// (a handler's deferred release, a closed connection's read loop) end
// before it names them: generous, for a slow shared machine, and spent only
// when something is still running.
const Wait = 10 * time.Second

// Main runs m and exits with its code, or with 1 when m passed but
// goroutines other than the runtime's and the testing package's are still
// alive after Wait; it prints their stacks to standard error.
func Main(m M) { os.Exit(run(m, os.Stderr, Wait)) }

func run(m M, w io.Writer, wait time.Duration) int {
	code := m.Run()
	if code != 0 {
		return code
	}
	if left := Leaked(wait); len(left) > 0 {
		fmt.Fprintf(w, "leakcheck: %d goroutines left after a successful run:\n\n%s\n",
			len(left), strings.Join(left, "\n\n"))
		return 1
	}
	return 0
}

// Leaked returns the stacks of the goroutines, other than the caller's,
// the runtime's and the testing package's, that are still alive after
// waiting up to wait for them to end: none, at once, when none is alive.
func Leaked(wait time.Duration) []string {
	deadline := time.Now().Add(wait)
	pause := time.Millisecond
	for {
		left := others()
		if len(left) == 0 || !time.Now().Before(deadline) {
			return left
		}
		time.Sleep(pause)
		pause = min(2*pause, 100*time.Millisecond)
	}
}

// others returns the stacks of every goroutine but the caller's and those
// ignore accepts.
func others() []string {
	buf := make([]byte, 64<<10)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	// The caller's goroutine comes first; each is separated by a blank line.
	stacks := strings.Split(strings.TrimSpace(string(buf)), "\n\n")
	var left []string
	for _, s := range stacks[1:] {
		if !ignore(parse(s)) {
			left = append(left, s)
		}
	}
	return left
}

// stack is one goroutine of a traceback: its state ("chan receive",
// "select", "syscall, 2 minutes") and its functions, innermost first, the
// one that created it last.
type stack struct {
	state string
	funcs []string
}

// parse reads one goroutine of runtime.Stack's output:
//
//	goroutine 7 [chan receive]:
//	testing.(*T).Run(0xc000003a00, ...)
//		/usr/local/go/src/testing/testing.go:1751 +0x3ab
//	created by testing.runTests in goroutine 1
//		/usr/local/go/src/testing/testing.go:2161 +0x37
func parse(s string) stack {
	lines := strings.Split(s, "\n")
	var st stack
	if head := lines[0]; strings.HasPrefix(head, "goroutine ") {
		if i, j := strings.IndexByte(head, '['), strings.LastIndexByte(head, ']'); i >= 0 && j > i {
			st.state = head[i+1 : j]
		}
	}
	for _, l := range lines[1:] {
		if l == "" || l[0] == '\t' {
			continue // a file:line
		}
		l = strings.TrimPrefix(l, "created by ")
		if i := strings.Index(l, " in goroutine "); i >= 0 {
			l = l[:i]
		}
		if i := strings.LastIndexByte(l, '('); i > 0 && strings.HasSuffix(l, ")") {
			l = l[:i]
		}
		st.funcs = append(st.funcs, l)
	}
	return st
}

func (s stack) first() string {
	if len(s.funcs) == 0 {
		return ""
	}
	return s.funcs[0]
}

func (s stack) has(fn string) bool {
	for _, f := range s.funcs {
		if f == fn {
			return true
		}
	}
	return false
}

// ignore accepts the goroutines that goleak ignores by default: the testing
// package's own, waiting on a channel; os/signal's loop and the runtime's
// signal handling; a trace reader; and cgo's in a system call.
func ignore(s stack) bool {
	switch s.first() {
	case "testing.RunTests", "testing.(*T).Run", "testing.(*T).Parallel", "testing.runFuzzing", "testing.runFuzzTests":
		return strings.HasPrefix(s.state, "chan receive")
	case "os/signal.signal_recv", "os/signal.loop":
		return true
	}
	return s.has("runtime.ensureSigM") || s.has("runtime.ReadTrace") ||
		(s.has("runtime.goexit") && strings.HasPrefix(s.state, "syscall"))
}
