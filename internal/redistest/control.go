//go:build unix

package redistest

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Proc is a private redis-server that a test can pause, resume, kill and
// restart on the same address, to simulate an outage with a real server:
//
//	p := redistest.StartProc(t, "--appendonly", "yes", "--dir", t.TempDir())
//	p.Pause()   // SIGSTOP: connections are accepted, nothing is answered
//	p.Resume()  // SIGCONT
//	p.Kill()    // SIGKILL: connections are refused
//	p.Restart() // the same arguments on the same port
//
// Unlike [Start], StartProc never uses IDEM_REDIS_ADDR. The server is
// killed, and waited for, when the test ends (also when it is paused). A
// Proc's methods are safe for concurrent use; they fail the test on error.
type Proc struct {
	t    testing.TB
	bin  string
	args []string
	port int
	addr string

	mu     sync.Mutex
	srv    *server // nil while killed
	paused bool
}

// StartProc starts a redis-server of the test's own, with extra
// command-line arguments, and returns its handle. It skips or fails the
// test like [Addr].
func StartProc(t testing.TB, args ...string) *Proc {
	t.Helper()
	srv, err := start(args...)
	check(t, err)
	return newProc(t, srv, args)
}

// StartValkeyProc is [StartProc] with a valkey-server (see EnvValkey for
// which binary). It skips or fails the test like [StartValkey].
func StartValkeyProc(t testing.TB, args ...string) *Proc {
	t.Helper()
	bin, err := valkeyBin()
	var srv *server
	if err == nil {
		srv, err = startValkey(bin, args...)
	}
	checkValkey(t, err)
	return newProc(t, srv, args)
}

// newProc returns the handle of srv, started with args.
func newProc(t testing.TB, srv *server, args []string) *Proc {
	_, port, _ := net.SplitHostPort(srv.addr)
	p := &Proc{t: t, bin: srv.cmd.Path, args: args, addr: srv.addr, srv: srv}
	p.port, _ = strconv.Atoi(port)
	t.Cleanup(p.stop)
	return p
}

// Addr returns the server's address; it stays the same across restarts.
func (p *Proc) Addr() string { return p.addr }

// Pid returns the process id of the running server, or 0 while killed.
func (p *Proc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.srv == nil {
		return 0
	}
	return p.srv.cmd.Process.Pid
}

// Pause stops the server with SIGSTOP and returns once the kernel reports
// it stopped (on Linux; elsewhere once the signal is sent). The kernel
// still accepts connections to its port (up to the listen backlog) and
// buffers what clients send, so clients see timeouts, not refusals; the
// server executes what was buffered when resumed.
func (p *Proc) Pause() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.srv == nil || p.paused {
		p.t.Fatal("redistest: Pause: server not running")
	}
	pid := p.srv.cmd.Process.Pid
	if err := p.srv.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		p.t.Fatalf("redistest: SIGSTOP %d: %v", pid, err)
	}
	if err := waitState(pid, 'T', 5*time.Second); err != nil {
		p.t.Fatalf("redistest: SIGSTOP %d: %v", pid, err)
	}
	p.paused = true
}

// Resume continues a paused server with SIGCONT.
func (p *Proc) Resume() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.srv == nil || !p.paused {
		p.t.Fatal("redistest: Resume: server not paused")
	}
	if err := p.srv.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		p.t.Fatalf("redistest: SIGCONT %d: %v", p.srv.cmd.Process.Pid, err)
	}
	p.paused = false
}

// Kill kills the server with SIGKILL and waits for it to exit; from then
// on connections to its address are refused. What the server had not
// written to its append-only file (if any) is lost.
func (p *Proc) Kill() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.srv == nil {
		p.t.Fatal("redistest: Kill: server not running")
	}
	p.srv.stop()
	p.srv, p.paused = nil, false
}

// Restart starts a killed server again, with the same arguments on the
// same port, and returns once it answers PING. With persistence among the
// arguments (--appendonly yes and a --dir of the test's own) the new
// server loads what the old one wrote; without, it starts empty.
func (p *Proc) Restart() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.srv != nil {
		p.t.Fatal("redistest: Restart: server still running")
	}
	// The port was just freed by a process of this test; another process
	// taking it in between is unlikely but possible, so it retries a
	// little while the bind fails.
	var err error
	for attempt := 1; attempt <= 5; attempt++ {
		var srv *server
		if srv, err = startAt(p.bin, p.port, p.args); err == nil {
			p.srv = srv
			return
		}
		time.Sleep(100 * time.Millisecond) // the port of another process: nothing to wait on but time
	}
	p.t.Fatalf("redistest: Restart on port %d: %v", p.port, err)
}

// stop kills the server, if running (a paused process dies of SIGKILL
// too), and waits for it.
func (p *Proc) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.srv != nil {
		p.srv.stop()
		p.srv = nil
	}
}

// waitState polls /proc/pid/stat until the process is in state (on Linux;
// elsewhere, where there is no /proc, it returns at once).
func waitState(pid int, state byte, timeout time.Duration) error {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		return nil // no procfs
	}
	path := "/proc/" + strconv.Itoa(pid) + "/stat"
	deadline := time.Now().Add(timeout)
	for {
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		// The command name, in parentheses, may hold spaces: the state
		// follows the last ')'.
		s := string(b)
		if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) && s[i+2] == state {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("process %d not in state %c after %v: %s", pid, state, timeout, s)
		}
		time.Sleep(time.Millisecond) // the kernel's state: nothing to wait on but time
	}
}
