// Package redistest gives tests a real redis-server and counts the round
// trips a go-redis client makes.
//
// [Addr] returns IDEM_REDIS_ADDR when it is set. Otherwise it starts one
// redis-server from PATH per test binary, on a free loopback port, without
// persistence; [Main] stops it when the tests end (and the kernel kills it
// if the test binary dies first). Without a server the test is skipped,
// unless IDEM_REQUIRE_REDIS=1, as in CI, where it fails.
package redistest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

var (
	mu      sync.Mutex
	started *exec.Cmd
	addr    string
	failed  error
)

// Addr returns the address of a real redis-server, starting one if need
// be. Tests sharing it must use keys (or prefixes) of their own.
func Addr(t testing.TB) string {
	t.Helper()
	if a := os.Getenv("IDEM_REDIS_ADDR"); a != "" {
		return a
	}
	mu.Lock()
	defer mu.Unlock()
	if addr == "" && failed == nil {
		addr, failed = start()
	}
	if failed != nil {
		if os.Getenv("IDEM_REQUIRE_REDIS") == "1" {
			t.Fatalf("redistest: IDEM_REQUIRE_REDIS=1 but no Redis: %v", failed)
		}
		t.Skipf("redistest: no Redis (%v); install redis-server or set IDEM_REDIS_ADDR", failed)
	}
	return addr
}

// Start starts a new redis-server on a free loopback port with extra
// arguments, for tests that stop, stall or kill it. It returns the command
// and its address; the caller stops it with t.Cleanup(func(){ Stop(cmd) }).
// It skips or fails the test like Addr when there is no redis-server.
func Start(t testing.TB, args ...string) (*exec.Cmd, string) {
	t.Helper()
	cmd, a, err := startServer(args...)
	if err != nil {
		if os.Getenv("IDEM_REQUIRE_REDIS") == "1" {
			t.Fatalf("redistest: IDEM_REQUIRE_REDIS=1 but no Redis: %v", err)
		}
		t.Skipf("redistest: no Redis (%v); install redis-server", err)
	}
	return cmd, a
}

func start() (string, error) {
	cmd, a, err := startServer()
	if err == nil {
		started = cmd
	}
	return a, err
}

func startServer(args ...string) (*exec.Cmd, string, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, "", err
	}
	port, err := freePort()
	if err != nil {
		return nil, "", err
	}
	a := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	cmd := exec.Command(bin, append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--daemonize", "no"}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	if err := WaitReady(a, 10*time.Second); err != nil {
		Stop(cmd)
		return nil, "", err
	}
	return cmd, a, nil
}

// WaitReady polls addr with PING until it answers or timeout passes.
func WaitReady(addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := ping(addr)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis at %s not ready after %v: %w", addr, timeout, err)
		}
		time.Sleep(20 * time.Millisecond) // polling an external process; nothing to wait on
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
	if line != "+PONG\r\n" {
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

// Stop kills a server started by Start and waits for it to exit.
func Stop(cmd *exec.Cmd) {
	if cmd == nil || cmd.Process == nil {
		return
	}
	cmd.Process.Kill()
	cmd.Wait()
}

// Main runs the tests, stops the shared redis-server, and fails the run if
// goroutines leaked. Call it from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	mu.Lock()
	Stop(started)
	started, addr = nil, ""
	mu.Unlock()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Counter is a go-redis hook that counts round trips: one per command,
// one per pipeline. Add it with rdb.AddHook. Safe for concurrent use.
type Counter struct{ n atomic.Int64 }

// Count returns the round trips since the last Reset.
func (c *Counter) Count() int64 { return c.n.Load() }

// Reset sets the count to zero.
func (c *Counter) Reset() { c.n.Store(0) }

// DialHook implements redis.Hook.
func (c *Counter) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (c *Counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook implements redis.Hook.
func (c *Counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmds)
	}
}
