// Package redistest gives tests a real redis-server. It imports no Redis
// client, so that every module of the kit can use it; internal/tests/redisx
// counts the round trips a go-redis client makes.
//
// [Addr] returns IDEM_REDIS_ADDR when it is set. Otherwise it starts one
// redis-server from PATH (or the binary IDEM_REDIS_SERVER names, such as
// a valkey-server: every server this package starts is then one) per test binary, lazily, on a free loopback port,
// without persistence, and shares it between the tests of the binary (so
// tests must use keys or prefixes of their own). Without a redis-server the
// test is skipped, unless IDEM_REQUIRE_REDIS=1 (as in CI), where it fails.
//
// The shared server is stopped when the tests end if the package's TestMain
// goes through [Wrap]:
//
//	func TestMain(m *testing.M) { leakcheck.Main(redistest.Wrap(m)) }
//
// On Linux the server also gets SIGKILL when the test binary exits, so a
// package that forgets to do so, or a test binary that crashes, leaves no
// server behind.
package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Environment variables read by [Addr] and [Start].
const (
	// EnvAddr names a running Redis to use instead of starting one.
	EnvAddr = "IDEM_REDIS_ADDR"
	// EnvRequire, set to "1", turns a missing redis-server into a failure.
	EnvRequire = "IDEM_REQUIRE_REDIS"
)

const noServer = "redistest: no redis-server on PATH and IDEM_REDIS_ADDR unset"

// shared is the server that Addr starts for the whole test binary.
var shared struct {
	mu   sync.Mutex
	srv  *server
	err  error // why it could not start; sticky, so it is tried once
	done bool  // tried
}

// Addr returns the address of a real redis-server: IDEM_REDIS_ADDR when it
// is set (returned as is, never flushed), else a server that Addr starts on
// first use and shares with every test of the binary. It skips the test
// when there is no redis-server on PATH, or fails it when
// IDEM_REQUIRE_REDIS=1; it fails the test when redis-server is there but
// does not start.
func Addr(t testing.TB) string {
	t.Helper()
	if a := os.Getenv(EnvAddr); a != "" {
		return a
	}
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if !shared.done {
		shared.done = true
		shared.srv, shared.err = start()
	}
	check(t, shared.err)
	return shared.srv.addr
}

// Start starts a redis-server of the test's own, with extra command-line
// arguments (for example "--cluster-enabled", "yes"), and returns its
// address. It ignores IDEM_REDIS_ADDR. The server is killed, and waited
// for, when the test ends. It skips or fails the test like [Addr].
func Start(t testing.TB, args ...string) string {
	t.Helper()
	srv, err := start(args...)
	check(t, err)
	t.Cleanup(srv.stop)
	return srv.addr
}

// check skips or fails t for a start error.
func check(t testing.TB, err error) {
	t.Helper()
	switch {
	case err == nil:
	case errors.Is(err, exec.ErrNotFound) && os.Getenv(EnvRequire) != "1":
		t.Skip(noServer)
	case errors.Is(err, exec.ErrNotFound):
		t.Fatal(noServer + ", and " + EnvRequire + "=1")
	default:
		t.Fatalf("redistest: %v", err)
	}
}

// Wrap returns m with a Run that runs the tests and then stops the shared
// server, for a TestMain of its own:
//
//	func TestMain(m *testing.M) { leakcheck.Main(redistest.Wrap(m)) }
func Wrap(m M) M { return wrapped{m} }

// M is what a TestMain runs: *testing.M, or another M wrapped (the
// same as leakcheck.M).
type M interface{ Run() int }

type wrapped struct{ m M }

func (w wrapped) Run() int {
	defer stopShared()
	return w.m.Run()
}

func stopShared() {
	stopCluster()
	stopValkey()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.srv != nil {
		shared.srv.stop()
	}
	shared.srv, shared.err, shared.done = nil, nil, false
}

type server struct {
	cmd  *exec.Cmd
	addr string
	log  string // file holding the server's output
}

// stop kills the server, waits for it and removes its log.
func (s *server) stop() {
	s.cmd.Process.Kill()
	s.cmd.Wait()
	os.Remove(s.log)
}

// start runs redis-server on a free loopback port. A port taken between
// choosing it and the server binding it makes the server exit, so it tries
// a few ports.
func start(args ...string) (*server, error) {
	bin, err := serverBin()
	if err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		srv, err := startOn(bin, args)
		if err == nil || attempt == 3 {
			return srv, err
		}
	}
}

// startOn runs redis-server on a free loopback port.
func startOn(bin string, args []string) (*server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	return startAt(bin, port, args)
}

// startAt runs redis-server on the given loopback port, without
// persistence unless args say otherwise, and waits until it answers PING.
func startAt(bin string, port int, args []string) (*server, error) {
	// The output goes to a file, not a pipe: a pipe needs a goroutine that
	// copies it, which leakcheck would report in packages that never stop the
	// shared server.
	log, err := os.CreateTemp("", "redistest-*.log")
	if err != nil {
		return nil, err
	}
	defer log.Close()
	srv := &server{
		addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		log:  log.Name(),
		cmd: exec.Command(bin, append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--daemonize", "no"}, args...)...),
	}
	srv.cmd.Stdout, srv.cmd.Stderr = log, log
	srv.cmd.SysProcAttr = sysProcAttr()
	if err := srv.cmd.Start(); err != nil {
		os.Remove(srv.log)
		return nil, err
	}
	if err := waitReady(srv.addr, 10*time.Second); err != nil {
		out, _ := os.ReadFile(srv.log)
		srv.stop()
		return nil, fmt.Errorf("redis-server on %s: %w; its output:\n%s", srv.addr, err, out)
	}
	return srv, nil
}

// waitReady polls addr with PING until it answers or timeout passes.
func waitReady(addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := ping(addr)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v: %w", timeout, err)
		}
		time.Sleep(10 * time.Millisecond) // an external process: nothing to wait on but time
	}
}

func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" && !strings.HasPrefix(line, "-NOAUTH ") { // a server with requirepass is up too
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
