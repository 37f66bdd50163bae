package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/dynamotest"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/redistest"
)

// gatewayBin is the binary the process tests start: IDEM_GATEWAY_BIN
// (CI's, built as the Dockerfile builds it), else one built for the run
// (with -race when the tests run with it).
var gatewayBin string

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	gatewayBin = os.Getenv("IDEM_GATEWAY_BIN")
	if gatewayBin == "" {
		dir, err := os.MkdirTemp("", "idem-gateway-test")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		gatewayBin = filepath.Join(dir, "idem-gateway")
		args := []string{"build", "-o", gatewayBin}
		if raceEnabled {
			args = append(args, "-race")
		}
		goCmd, err := exec.LookPath("go")
		if err != nil {
			fmt.Fprintln(os.Stderr, "no go command on PATH to build the gateway (or set IDEM_GATEWAY_BIN)")
			return 1
		}
		cmd := exec.Command(goCmd, append(args, ".")...)
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
			return 1
		}
	}
	return pgtest.Wrap(redistest.Wrap(dynamotest.Wrap(m))).Run()
}

// proc is a gateway process started as a user starts it.
type proc struct {
	t     testing.TB
	cmd   *exec.Cmd
	file  string
	addr  string // the first listener's
	admin string // "" without an admin listener
	done  chan struct{}
	err   error // the process's exit, once done is closed

	mu   sync.Mutex
	logs []map[string]any
	raw  []string
	seen chan struct{} // closed and replaced at each log line
}

// startGateway writes config to a file and starts a gateway on it; it
// waits until the gateway says it is ready, and kills it at the end of the
// test. Listeners declared on port 0 get their ports from the log.
func startGateway(t testing.TB, config string, env ...string) *proc {
	t.Helper()
	file := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(file, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	p := launch(t, file, env...)
	p.waitLog(t, "ready", 60*time.Second)
	return p
}

// launch starts a gateway on file without waiting.
func launch(t testing.TB, file string, env ...string) *proc {
	t.Helper()
	cmd := exec.Command(gatewayBin, "-config", file)
	cmd.Env = append(os.Environ(), env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, cmd: cmd, file: file, done: make(chan struct{}), seen: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go p.read(stderr)
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("gateway %d log:\n%s", cmd.Process.Pid, strings.Join(p.lines(), "\n"))
		}
	})
	return p
}

// read collects the process's log lines until it exits.
func (p *proc) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		var m map[string]any
		json.Unmarshal([]byte(line), &m) // a line that is not JSON stays in raw only
		p.mu.Lock()
		p.raw = append(p.raw, line)
		if m != nil {
			p.logs = append(p.logs, m)
			switch m["msg"] {
			case "listening":
				if m["listener"] == float64(0) {
					p.addr = m["addr"].(string)
				}
			case "admin listening":
				p.admin = m["addr"].(string)
			}
		}
		close(p.seen)
		p.seen = make(chan struct{})
		p.mu.Unlock()
	}
	p.err = p.cmd.Wait()
	close(p.done)
}

func (p *proc) lines() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.raw...)
}

// count returns how many log lines have msg and every attribute of attrs.
func (p *proc) count(msg string, attrs ...any) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
next:
	for _, m := range p.logs {
		if m["msg"] != msg {
			continue
		}
		for i := 0; i+1 < len(attrs); i += 2 {
			if fmt.Sprint(m[attrs[i].(string)]) != fmt.Sprint(attrs[i+1]) {
				continue next
			}
		}
		n++
	}
	return n
}

// waitLog waits until the log has a line with msg (and attrs), failing the
// test when the process exits first or d passes.
func (p *proc) waitLog(t testing.TB, msg string, d time.Duration, attrs ...any) {
	t.Helper()
	p.waitLogs(t, msg, 1, d, attrs...)
}

// waitLogs waits until the log has n lines with msg (and attrs).
func (p *proc) waitLogs(t testing.TB, msg string, n int, d time.Duration, attrs ...any) {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		p.mu.Lock()
		seen := p.seen
		p.mu.Unlock()
		if p.count(msg, attrs...) >= n {
			return
		}
		select {
		case <-seen:
		case <-p.done:
			if p.count(msg, attrs...) >= n {
				return
			}
			t.Fatalf("gateway exited (%v) before logging %q x%d:\n%s", p.err, msg, n, strings.Join(p.lines(), "\n"))
		case <-timer.C:
			t.Fatalf("no %q x%d in the gateway's log after %v:\n%s", msg, n, d, strings.Join(p.lines(), "\n"))
		}
	}
}

// signal sends sig to the process.
func (p *proc) signal(sig syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatal(err)
	}
}

// wait waits for the process to exit and returns its exit code.
func (p *proc) wait(t testing.TB, d time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(d):
		t.Fatalf("gateway still running %v after it was told to stop", d)
	}
	return p.cmd.ProcessState.ExitCode()
}

// url returns the URL of path on the gateway's first listener.
func (p *proc) url(path string) string { return "http://" + p.addr + path }

// upstream is a service behind the gateway that counts its executions,
// by the idempotency key the gateway passes on; each answer names its
// execution, so that a replay is told from a second run.
type upstream struct {
	*httptest.Server
	mu    sync.Mutex
	runs  map[string]int
	total int
	// gate, when set (hold), holds each execution after it counted until
	// it is closed (release, or the test's end).
	gate    chan struct{}
	open    func()
	arrived chan string // the key of each execution, when not nil
}

func newUpstream(t testing.TB) *upstream {
	u := &upstream{runs: map[string]int{}}
	u.Server = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.Close)
	t.Cleanup(u.release) // first: Close waits for the executions the gate holds
	return u
}

// hold makes the executions from now on wait at a gate until release.
func (u *upstream) hold() {
	gate := make(chan struct{})
	u.mu.Lock()
	u.gate, u.open = gate, sync.OnceFunc(func() { close(gate) })
	u.mu.Unlock()
}

// release lets the executions held at the gate go on.
func (u *upstream) release() {
	u.mu.Lock()
	open := u.open
	u.mu.Unlock()
	if open != nil {
		open()
	}
}

func (u *upstream) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	key := r.Header.Get("Idempotency-Key")
	u.mu.Lock()
	u.total++
	n := u.total
	u.runs[key]++
	gate, arrived := u.gate, u.arrived
	u.mu.Unlock()
	if arrived != nil {
		arrived <- key
	}
	if gate != nil {
		<-gate
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Execution", strconv.Itoa(n))
	if s, err := strconv.Atoi(r.Header.Get("X-Upstream-Status")); err == nil {
		w.WriteHeader(s) // the client asks for a status
		return
	}
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"execution":%d,"method":%q,"path":%q,"body":%q}`+"\n", n, r.Method, r.URL.Path, body)
}

func (u *upstream) ran(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.runs[key]
}

func (u *upstream) executions() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.total
}

// answer is what a client got.
type answer struct {
	status   int
	header   http.Header
	body     string
	replayed bool
	err      error
}

func (a answer) String() string {
	if a.err != nil {
		return "error " + a.err.Error()
	}
	return fmt.Sprintf("%d replayed=%v %q", a.status, a.replayed, a.body)
}

// post sends a POST with key (none when "") and body.
func post(ctx context.Context, client *http.Client, url, key, body string, header ...string) answer {
	req, err := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(body))
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := client.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return answer{status: res.StatusCode, header: res.Header, body: string(b), replayed: res.Header.Get("Idempotent-Replayed") == "true", err: err}
}

// settled is post for a retry that expects the stored response: the
// middleware stores a record just after its response went out, so a
// client that retries at once may find the execution still in flight and
// get 409 (ErrConflict); it then retries, as a client told Retry-After
// would, a little sooner.
func settled(ctx context.Context, client *http.Client, url, key, body string, header ...string) answer {
	for {
		a := post(ctx, client, url, key, body, header...)
		if !inFlight(a) || ctx.Err() != nil {
			return a
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// inFlight reports whether a is the 409 of an execution in flight.
func inFlight(a answer) bool {
	return a.err == nil && a.status == http.StatusConflict && strings.Contains(a.body, "#ErrConflict")
}

// memoryConfig is a one-instance gateway in front of up.
func memoryConfig(up *upstream, extra string) string {
	return fmt.Sprintf(`listen:
  - address: 127.0.0.1:0
admin:
  address: 127.0.0.1:0
log:
  level: debug
store:
  memory: {}
upstreams:
  app:
    url: %s
routes:
  - match: /
    upstream: app
    scope: {none: true}
%s`, up.URL, extra)
}

// receive returns the next value of ch, failing the test when ctx ends
// first.
func receive[T any](t testing.TB, ctx context.Context, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-ctx.Done():
		t.Fatalf("waiting for %s: %v", what, ctx.Err())
		panic("unreachable")
	}
}
