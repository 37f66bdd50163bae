package dynamotest

import (
	"errors"
	"sync"
	"testing"
)

// Proc is a private dynalite that a test can kill and start again on the
// same port and data, or pause, to simulate an outage with a real server:
//
//	p := dynamotest.StartProc(t)
//	client := ... p.Endpoint() ...
//	p.Kill()   // SIGKILL: connections break, new ones are refused
//	p.Start()  // the same port, tables and items
//	p.Pause()  // SIGSTOP: connections are accepted, nothing is answered
//	p.Resume() // SIGCONT: what was sent meanwhile is answered
//
// Unlike [Endpoint], StartProc never uses IDEM_DYNAMODB_ENDPOINT, and
// never shares its server. Its server keeps its tables in LevelDB
// (dynalite --path) in its directory, and answers a write once LevelDB has
// written it to its log, so a write acknowledged before Kill is there
// after Start (Kill kills the server's process, not the machine, so what
// it wrote is in the kernel's cache even if the kernel has not synced it
// yet). A table is made ACTIVE just after CreateTable is answered; one
// killed before that stays CREATING, so a test waits for ACTIVE
// (DescribeTable) before Kill. The server is stopped, and its directory
// removed, when the test ends. A Proc's methods are safe for concurrent
// use; they fail the test on error.
type Proc struct {
	t        testing.TB
	endpoint string

	mu      sync.Mutex
	srv     *server
	running bool
	paused  bool
}

// errNoPause is pause's error where it is not implemented.
var errNoPause = errors.New("Pause is implemented on Linux only")

// StartProc starts a dynalite of the test's own, kept in LevelDB, and
// returns its handle. It skips or fails the test like [Endpoint].
func StartProc(t testing.TB) *Proc {
	t.Helper()
	srv, err := start(true)
	check(t, err)
	p := &Proc{t: t, endpoint: srv.endpoint, srv: srv, running: true}
	t.Cleanup(func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.running {
			p.srv.stop()
		} else {
			p.srv.removeDir()
		}
		p.running, p.paused = false, false
	})
	return p
}

// Endpoint returns the server's URL ("http://127.0.0.1:PORT"); it stays
// the same across restarts.
func (p *Proc) Endpoint() string { return p.endpoint }

// Kill stops the server as a crash would: SIGKILL, which breaks every
// connection at once and answers none of the requests in flight (a write
// among them may or may not have been made). It works on a paused server
// too. It returns once the server has exited; from then on connections
// are refused.
func (p *Proc) Kill() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.running {
		p.t.Fatal("dynamotest: Kill of a server that is not running")
	}
	p.srv.cmd.Process.Kill()
	p.srv.cmd.Wait()
	p.running, p.paused = false, false
}

// Start starts a killed server again, on the same port and LevelDB, and
// returns once it answers. It fails the test if the server does not
// start (another process took the port meanwhile, say).
func (p *Proc) Start() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.running {
		p.t.Fatal("dynamotest: Start of a server that is running")
	}
	old := p.srv
	srv, err := startAt(old.bin, old.dir, old.port, old.persist)
	if err != nil {
		p.t.Fatalf("dynamotest: restarting the server: %v", err)
	}
	p.srv, p.running = srv, true
}

// Pause stops the server's process (SIGSTOP), as a hung server: the
// kernel still accepts connections and takes requests, but nothing is
// answered until Resume, so a client waits for its timeout. It returns
// once the process is stopped. It is implemented on Linux only, and skips
// the test elsewhere.
func (p *Proc) Pause() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.running || p.paused {
		p.t.Fatal("dynamotest: Pause of a server that is not running, or paused")
	}
	if err := pause(p.srv.cmd); errors.Is(err, errNoPause) {
		p.t.Skip("dynamotest: " + err.Error())
	} else if err != nil {
		p.t.Fatalf("dynamotest: pausing the server: %v", err)
	}
	p.paused = true
}

// Resume continues a paused server (SIGCONT); it answers what it was sent
// while paused, unless the clients have gone.
func (p *Proc) Resume() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.paused {
		p.t.Fatal("dynamotest: Resume of a server that is not paused")
	}
	if err := resume(p.srv.cmd); err != nil {
		p.t.Fatalf("dynamotest: resuming the server: %v", err)
	}
	p.paused = false
}
