package pgtest

import (
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/testproc"
)

// Proc is a private PostgreSQL server that a test can crash and start
// again on the same port and data, to simulate an outage with a real
// server:
//
//	p := pgtest.StartProc(t)
//	pool := ... p.DSN() ...
//	p.Crash()   // an immediate shutdown: connections break, new ones are refused
//	p.Restart() // crash recovery on the same port, then it accepts connections
//
// Unlike [DSN], StartProc never uses IDEM_PG_DSN. Its server commits
// synchronously (synchronous_commit=on, unlike the shared server's), so a
// commit acknowledged before Crash survives it: Crash kills the server's
// processes, not the machine, so what they wrote is in the kernel's cache
// even without fsync. The server is stopped, and its directory removed,
// when the test ends. A Proc's methods are safe for concurrent use; they
// fail the test on error.
type Proc struct {
	t   testing.TB
	dsn string

	mu      sync.Mutex
	srv     *server // its cmd is nil while crashed
	running bool
}

// StartProc starts a PostgreSQL server of the test's own, with settings
// ("name=value", each passed as -c) that override the package's, and
// returns its handle. It skips or fails the test like [DSN].
func StartProc(t testing.TB, settings ...string) *Proc {
	t.Helper()
	srv, err := start(append([]string{"synchronous_commit=on"}, settings...))
	check(t, err)
	p := &Proc{t: t, dsn: srv.dsn, srv: srv, running: true}
	t.Cleanup(func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.running {
			p.srv.stop()
		} else {
			p.srv.removeDir()
		}
		p.running = false
	})
	return p
}

// DSN returns the server's connection string; it stays the same across
// restarts.
func (p *Proc) DSN() string { return p.dsn }

// Crash stops the server as a crash would: SIGQUIT, PostgreSQL's immediate
// shutdown, which ends every backend at once, without a checkpoint. It
// returns once the server has exited; from then on connections are
// refused.
func (p *Proc) Crash() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.running {
		p.t.Fatal("pgtest: Crash of a server that is not running")
	}
	testproc.Stop(p.srv.cmd, syscall.SIGQUIT, 10*time.Second)
	p.running = false
}

// Restart starts a crashed server again, on the same port and data
// directory with the same settings, and returns once it accepts
// connections (after its crash recovery).
func (p *Proc) Restart() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.running {
		p.t.Fatal("pgtest: Restart of a server that is running")
	}
	old := p.srv
	srv, err := startAt(old.bin, old.dir, old.cred, old.port, old.settings)
	if err != nil {
		p.t.Fatalf("pgtest: restarting the server: %v", err)
	}
	p.srv, p.running = srv, true
}
