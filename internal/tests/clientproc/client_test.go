package clientproc

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestAgainstNetHTTPExample drives examples/nethttp, run as a process
// (`go run ./examples/nethttp`), with examples/client, run as a process
// (`go run ./examples/client -addr ...`), twice: the second run's orders
// are the server's third and fourth, and the server's log shows two
// executions per run once it has stopped.
func TestAgainstNetHTTPExample(t *testing.T) {
	bin := buildExamples(t, "client", "nethttp")
	srv := startNetHTTP(t, bin["nethttp"])
	for run := range 2 {
		out := runClient(t, bin["client"], "-addr", srv.addr)
		checkTranscript(t, out, 2*run+1)
	}
	srv.stop(t)
	checkExecutions(t, srv.log.String(), 4)
}

// buildExamples builds the commands of examples/<name> for each name into
// a directory of the test's (without -race, so that they build and run
// quickly) and returns their paths by name.
func buildExamples(t *testing.T, names ...string) map[string]string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command, to build the examples: %v", err)
	}
	examples, err := filepath.Abs(filepath.Join("..", "..", "..", "examples"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	bins := make(map[string]string, len(names))
	for _, name := range names {
		args = append(args, "./"+name)
		bins[name] = filepath.Join(dir, name)
	}
	cmd := exec.Command(goBin, args...)
	cmd.Dir = examples
	cmd.Env = append(os.Environ(), "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s (in %s): %v\n%s", strings.Join(args[3:], " "), examples, err, out)
	}
	return bins
}

// runClient runs the client binary with args and returns its transcript
// (its standard output); it fails the test if the program exits with an
// error (it does when a call did not end as promised) or runs for more
// than 2 minutes.
func runClient(t *testing.T, bin string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("examples/client %s: %v\ntranscript:\n%s\nstderr:\n%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// checkTranscript checks what the user sees; first is handler_runs of the
// first order of this run.
func checkTranscript(t *testing.T, out string, first int) {
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

// checkExecutions checks that the server's log shows want executions (the
// handler ran once per order).
func checkExecutions(t *testing.T, log string, want int) {
	t.Helper()
	if n := strings.Count(log, "-> executed 201"); n != want {
		t.Errorf("the server's log shows %d executions, want %d:\n%s", n, want, log)
	}
}

// netHTTP is examples/nethttp running as a process.
type netHTTP struct {
	cmd  *exec.Cmd
	addr string
	log  buffer        // its stderr
	done chan struct{} // closed when its stderr ends

	waitOnce sync.Once
	waitErr  error
}

// wait waits for the process, once its stderr has ended.
func (s *netHTTP) wait() error {
	<-s.done
	s.waitOnce.Do(func() { s.waitErr = s.cmd.Wait() })
	return s.waitErr
}

// startNetHTTP runs the nethttp binary on a free port of the loopback and
// returns once it listens; it is killed when the test ends, unless stopped
// before.
func startNetHTTP(t *testing.T, bin string) *netHTTP {
	t.Helper()
	s := &netHTTP{cmd: exec.Command(bin, "-addr", "127.0.0.1:0"), done: make(chan struct{})}
	stderr, err := s.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	listening := make(chan string, 1)
	go func() {
		defer close(s.done)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			s.log.Write([]byte(line + "\n"))
			if rest, ok := strings.CutPrefix(line, "listening on http://"); ok {
				addr, _, _ := strings.Cut(rest, " ")
				listening <- addr
			}
		}
	}()
	t.Cleanup(func() {
		s.cmd.Process.Kill() // an error once it has exited
		s.wait()
	})
	select {
	case s.addr = <-listening:
	case <-s.done:
		t.Fatalf("examples/nethttp exited:\n%s", s.log.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("examples/nethttp not listening after 30 s:\n%s", s.log.String())
	}
	return s
}

// stop stops the server as a deploy does (SIGTERM) and waits for it.
func (s *netHTTP) stop(t *testing.T) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("examples/nethttp still running 30 s after SIGTERM:\n%s", s.log.String())
	}
	if err := s.wait(); err != nil {
		t.Errorf("examples/nethttp exited with %v:\n%s", err, s.log.String())
	}
}

// buffer is a process's output that one goroutine writes while the test
// may read it.
type buffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written so far.
func (b *buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
