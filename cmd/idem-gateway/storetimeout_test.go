//go:build linux

package main

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/redistest"
)

// A store whose server is frozen (SIGSTOP: its connections are accepted,
// nothing is answered) gets a protected request 503 with Retry-After
// after about the store's timeout, not a hang, and the upstream is not
// called; once the server goes on (SIGCONT), the gateway serves again,
// without a restart.
func TestProcessFrozenStore(t *testing.T) {
	for _, c := range []struct {
		name  string
		start func(t *testing.T) (store string, freeze, thaw func())
	}{
		{"postgres", func(t *testing.T) (string, func(), func()) {
			p := pgtest.StartProc(t)
			f := &pgFreezer{t: t, port: dsnPort(t, p.DSN())}
			t.Cleanup(f.thaw) // before the server's own cleanup: it cannot stop a stopped server
			return fmt.Sprintf("postgres: {dsn: %q, table: frozen, timeout: 2s}", p.DSN()), f.freeze, f.thaw
		}},
		{"redis rueidis", func(t *testing.T) (string, func(), func()) {
			p := redistest.StartProc(t)
			return fmt.Sprintf("redis: {client: rueidis, addrs: [%q], timeout: 2s}", p.Addr()), p.Pause, p.Resume
		}},
		{"redis go-redis", func(t *testing.T) (string, func(), func()) {
			p := redistest.StartProc(t)
			return fmt.Sprintf("redis: {client: go-redis, addrs: [%q], timeout: 2s}", p.Addr()), p.Pause, p.Resume
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			store, freeze, thaw := c.start(t)
			up := newUpstream(t)
			// A short lease: an Acquire that the frozen server runs once it
			// goes on, after the gateway gave up on it, holds its key no
			// longer than that.
			gw := startGateway(t, gatewayConfig(up.URL, store, "", "    lease: 2s\n"))
			ctx := deadline(t, 2*time.Minute)
			c := &http.Client{}
			if a := post(ctx, c, gw.url("/orders"), "before", `{}`); a.status != http.StatusCreated {
				t.Fatalf("before the freeze: %v, want 201", a)
			}

			freeze()
			began := time.Now()
			a := post(ctx, c, gw.url("/orders"), "during", `{}`)
			took := time.Since(began)
			if a.status != http.StatusServiceUnavailable || a.header.Get("Retry-After") == "" {
				t.Fatalf("while the store is frozen: %v after %v (Retry-After %q), want 503 with Retry-After", a, took, a.header.Get("Retry-After"))
			}
			if took > 10*time.Second { // the timeout is 2s: a generous bound, for a loaded machine
				t.Fatalf("while the store is frozen: 503 after %v, want it after about the store's timeout (2s)", took)
			}
			t.Logf("503 after %v", took)
			if n := up.ran("during"); n != 0 {
				t.Fatalf("the upstream ran %d times while the store was frozen", n)
			}

			thaw()
			for {
				a = post(ctx, c, gw.url("/orders"), "during", `{}`)
				// 503 until the store answers again; 409 while an Acquire
				// the store ran late holds the key (its lease).
				if (a.status != http.StatusServiceUnavailable && !inFlight(a)) || ctx.Err() != nil {
					break
				}
				time.Sleep(50 * time.Millisecond) // the client's own backoff
			}
			if a.status != http.StatusCreated || up.ran("during") != 1 {
				t.Fatalf("after the store went on: %v, the upstream ran %d times; want 201 and once", a, up.ran("during"))
			}
			if r := settled(ctx, c, gw.url("/orders"), "before", `{}`); !r.replayed {
				t.Fatalf("the response stored before: %v, want it replayed", r)
			}
		})
	}
}

// dsnPort returns the port of a postgres:// connection string.
func dsnPort(t testing.TB, dsn string) int {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		t.Fatalf("no port in %s", dsn)
	}
	return port
}

// pgFreezer stops every process of the PostgreSQL server that listens on
// port (the postmaster and its children: the backends that hold the
// gateway's connections, ...) and lets them go on again.
type pgFreezer struct {
	t    testing.TB
	port int

	mu      sync.Mutex
	stopped []int
}

func (f *pgFreezer) freeze() {
	f.t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	master, err := postmaster(f.port)
	if err != nil {
		f.t.Fatal(err)
	}
	// The postmaster first, so that it starts no process meanwhile.
	f.stop(master)
	for _, pid := range childrenOf(master) {
		f.stop(pid)
	}
}

func (f *pgFreezer) stop(pid int) {
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil && !errors.Is(err, syscall.ESRCH) {
		f.t.Fatalf("SIGSTOP %d: %v", pid, err)
	}
	f.stopped = append(f.stopped, pid)
}

// thaw lets the stopped processes go on; it does nothing when none are.
func (f *pgFreezer) thaw() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := len(f.stopped) - 1; i >= 0; i-- { // the postmaster last
		syscall.Kill(f.stopped[i], syscall.SIGCONT)
	}
	f.stopped = nil
}

// postmaster returns the pid of the postgres process started with -p port.
func postmaster(port int) (int, error) {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(bytes.TrimRight(b, "\x00")), "\x00")
		if filepath.Base(args[0]) != "postgres" {
			continue
		}
		for i := 0; i+1 < len(args); i++ {
			if args[i] == "-p" && args[i+1] == strconv.Itoa(port) {
				return strconv.Atoi(filepath.Base(dir))
			}
		}
	}
	return 0, fmt.Errorf("no postgres process with -p %d in /proc", port)
}

// childrenOf returns the pids of the processes whose parent is pid.
func childrenOf(pid int) []int {
	var pids []int
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(string(b[i+1:]))
		if len(fields) < 2 || fields[1] != strconv.Itoa(pid) {
			continue
		}
		if child, err := strconv.Atoi(filepath.Base(dir)); err == nil {
			pids = append(pids, child)
		}
	}
	return pids
}
