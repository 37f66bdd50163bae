package clientproc

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
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
		CheckTranscript(t, out, 2*run+1)
	}
	srv.stop(t)
	CheckExecutions(t, srv.log.String(), 4)
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
