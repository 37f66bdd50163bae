package mysqltest

import (
	"sync"
	"testing"
)

// Proc is a private MariaDB server that a test can crash and start again
// on the same port and data, to simulate an outage with a real server:
//
//	p := mysqltest.StartProc(t)
//	db := ... p.DSN() ...
//	p.Crash()   // SIGKILL: connections break, new ones are refused
//	p.Restart() // InnoDB's crash recovery on the same port, then it accepts connections
//
// Unlike [DSN], StartProc never uses IDEM_MYSQL_DSN, and never shares its
// server. Its server writes InnoDB's log at every commit
// (innodb_flush_log_at_trx_commit=1, MariaDB's default, unlike the shared
// server's 0, which writes it once a second), so a commit acknowledged
// before Crash survives it: Crash kills the server's process, not the
// machine, so what it wrote is in the kernel's cache even if the kernel
// has not synced it yet. The server is stopped, and its directory removed,
// when the test ends. A Proc's methods are safe for concurrent use; they
// fail the test on error.
type Proc struct {
	t   testing.TB
	dsn string

	mu      sync.Mutex
	srv     *server
	running bool
}

// StartProc starts a MariaDB server of the test's own, with settings
// ("name=value", each passed to mariadbd as --name=value) that override
// the package's, and returns its handle. It skips or fails the test like
// [DSN].
func StartProc(t testing.TB, settings ...string) *Proc {
	t.Helper()
	srv, err := start(append([]string{"innodb_flush_log_at_trx_commit=1"}, settings...))
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

// DSN returns the server's go-sql-driver/mysql DSN, without a database
// ("root@tcp(127.0.0.1:PORT)/?parseTime=true"); it stays the same across
// restarts.
func (p *Proc) DSN() string { return p.dsn }

// Crash stops the server as a crash would: SIGKILL of mariadbd, which
// breaks every connection at once, without a shutdown; the transactions
// it had not committed are rolled back by InnoDB's recovery at the next
// start. It returns once the server has exited; from then on connections
// are refused.
func (p *Proc) Crash() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.running {
		p.t.Fatal("mysqltest: Crash of a server that is not running")
	}
	p.srv.cmd.Process.Kill()
	p.srv.cmd.Wait()
	p.running = false
}

// Restart starts a crashed server again, on the same port and data
// directory with the same settings, and returns once it accepts
// connections (after InnoDB's crash recovery; the rollback of the
// transactions that were open at the crash may go on in the background,
// their rows locked until it is done).
func (p *Proc) Restart() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.running {
		p.t.Fatal("mysqltest: Restart of a server that is running")
	}
	old := p.srv
	srv, err := startAt(old.bin, old.dir, old.user, old.port, old.settings)
	if err != nil {
		p.t.Fatalf("mysqltest: restarting the server: %v", err)
	}
	p.srv, p.running = srv, true
}
