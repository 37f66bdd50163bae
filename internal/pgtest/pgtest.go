// Package pgtest gives tests a real PostgreSQL server. It imports no
// driver, so that every module of the kit can use it; internal/tests/pgxtest
// adds pgx pools, fresh tables and a round-trip counter on top.
//
// [DSN] returns IDEM_PG_DSN when it is set. Otherwise it starts one private
// server per test binary, lazily, and shares it between the tests of the
// binary (so each test uses tables of its own). The server's
// binaries are looked up with pg_config --bindir, then in
// /usr/lib/postgresql/*/bin (where Debian keeps them, off PATH), then on
// PATH. initdb refuses to run as root, so under root the server runs as the
// user postgres (created by the Debian package) or else nobody, in a
// temporary directory owned by that user. It listens on a free loopback
// port with trust authentication, and runs without fsync. Without
// PostgreSQL installed the test is skipped, unless IDEM_REQUIRE_PG=1 (as in
// CI), where it fails.
//
// The shared server is stopped, and its directory removed, when the tests
// end if the package's TestMain goes through [Wrap]:
//
//	func TestMain(m *testing.M) { leakcheck.Main(pgtest.Wrap(m)) }
//
// On Linux the server also gets SIGQUIT (an immediate shutdown, which
// removes its shared memory) when the test binary exits, so a package that
// does not stop it, or a test binary that crashes, leaves no server
// running; its directory is then removed by the next test binary that
// starts a server.
package pgtest

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/testproc"
)

// Environment variables read by [DSN].
const (
	// EnvDSN names a running PostgreSQL to use instead of starting one,
	// as a connection string that pgx accepts.
	EnvDSN = "IDEM_PG_DSN"
	// EnvRequire, set to "1", turns a missing PostgreSQL into a failure.
	EnvRequire = "IDEM_REQUIRE_PG"
)

// errNotInstalled means that no initdb and postgres were found.
var errNotInstalled = errors.New("pgtest: no PostgreSQL server binaries (initdb, postgres) found " +
	"by pg_config --bindir, in /usr/lib/postgresql/*/bin or on PATH, and " + EnvDSN + " unset")

// dirPrefix starts the name of every directory a server runs in.
const dirPrefix = "idem-pgtest-"

// shared is the server that DSN starts for the whole test binary.
var shared struct {
	mu   sync.Mutex
	srv  *server
	err  error // why it could not start; sticky, so it is tried once
	done bool  // tried
}

// DSN returns a connection string for a real PostgreSQL server:
// IDEM_PG_DSN when it is set (returned as is), else that of a server that
// DSN starts on first use and shares with every test of the binary. It
// skips the test when PostgreSQL is not installed, or fails it when
// IDEM_REQUIRE_PG=1; it fails the test when the server is there but does
// not start.
func DSN(t testing.TB) string {
	t.Helper()
	if d := os.Getenv(EnvDSN); d != "" {
		return d
	}
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if !shared.done {
		shared.done = true
		shared.srv, shared.err = start(nil)
	}
	check(t, shared.err)
	return shared.srv.dsn
}

// check skips or fails t for a start error.
func check(t testing.TB, err error) {
	t.Helper()
	switch {
	case err == nil:
	case errors.Is(err, errNotInstalled) && os.Getenv(EnvRequire) != "1":
		t.Skip(err.Error())
	case errors.Is(err, errNotInstalled):
		t.Fatal(err.Error() + ", and " + EnvRequire + "=1")
	default:
		t.Fatalf("pgtest: %v", err)
	}
}

// Wrap returns m with a Run that runs the tests and then stops the shared
// server, for a TestMain of its own:
//
//	func TestMain(m *testing.M) { leakcheck.Main(pgtest.Wrap(m)) }
func Wrap(m M) M { return testproc.Wrap(m, stopShared) }

// M is what a TestMain runs: *testing.M, or another M wrapped (the
// same as leakcheck.M).
type M = testproc.M

func stopShared() {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.srv != nil {
		shared.srv.stop()
	}
	shared.srv, shared.err, shared.done = nil, nil, false
}

type server struct {
	cmd *exec.Cmd
	dir string // the temporary directory: data, socket, logs
	dsn string

	// What starts it again on the same port and data (see Proc).
	bin      string
	cred     *cred
	port     int
	settings []string
}

// stop shuts the server down at once (SIGQUIT, an immediate shutdown:
// nothing is kept, so there is nothing to checkpoint), waits for it,
// killing it if it takes more than ten seconds, and removes its directory.
func (s *server) stop() {
	testproc.Stop(s.cmd, syscall.SIGQUIT, 10*time.Second)
	s.removeDir()
}

// removeDir removes the server's directory.
func (s *server) removeDir() { os.RemoveAll(s.dir) }

// start finds the binaries, runs initdb, and starts postgres on a free
// loopback port, with settings ("name=value", each passed as -c) after the
// package's own, which they override. A port taken between choosing it and
// the server binding it makes the server exit, so it tries a few ports.
func start(settings []string) (*server, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	testproc.Sweep(dirPrefix)
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", dirPrefix+"*")
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*server, error) {
		os.RemoveAll(dir)
		return nil, err
	}
	// The test binary's pid, for testproc.Sweep: a directory whose binary
	// is gone is removed by the next one.
	if err := testproc.WriteOwner(dir); err != nil {
		return fail(err)
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.uid), int(cred.gid)); err != nil {
			return fail(err)
		}
	}
	data := filepath.Join(dir, "data")
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "--auth=trust", "--username=postgres",
		"--encoding=UTF8", "--locale=C", "--no-sync")
	initdb.Env = env()
	initdb.SysProcAttr = sysProcAttr(cred)
	if out, err := initdb.CombinedOutput(); err != nil {
		return fail(fmt.Errorf("initdb in %s: %w; its output:\n%s", dir, err, out))
	}
	srv, err := testproc.OnFreePort(3, func(port int) (*server, error) {
		return startAt(bin, dir, cred, port, settings)
	})
	if err != nil {
		return fail(err)
	}
	return srv, nil
}

// startAt runs postgres on the data directory in dir, on the loopback
// port, and waits until it accepts connections.
func startAt(bin, dir string, cred *cred, port int, settings []string) (*server, error) {
	logName := filepath.Join(dir, "postgres.log")
	// The output goes to a file, not a pipe: a pipe needs a goroutine that
	// copies it, which leakcheck would report in packages that never stop the
	// shared server. It is appended to, so that the log of a restarted
	// server (see Proc) follows the first's.
	log, err := os.OpenFile(logName, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	// The socket goes to dir (the default, /var/run/postgresql, may not be
	// writable by the user), unless its path would be too long for a Unix
	// socket; the tests connect over TCP.
	sockets := dir
	if len(dir) > 80 {
		sockets = ""
	}
	args := []string{"-D", filepath.Join(dir, "data"),
		"-p", strconv.Itoa(port), "-k", sockets,
		"-c", "listen_addresses=127.0.0.1",
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "max_connections=200", "-c", "shared_buffers=32MB"}
	for _, s := range settings {
		args = append(args, "-c", s)
	}
	srv := &server{
		dir: dir, bin: bin, cred: cred, port: port, settings: settings,
		dsn: "postgres://postgres@" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) + "/postgres?sslmode=disable",
		cmd: exec.Command(filepath.Join(bin, "postgres"), args...),
	}
	srv.cmd.Env = env()
	srv.cmd.Stdout, srv.cmd.Stderr = log, log
	srv.cmd.SysProcAttr = sysProcAttr(cred)
	if err := srv.cmd.Start(); err != nil {
		return nil, err
	}
	if err := testproc.WaitReady(srv.cmd, 30*time.Second, srv.isReady); err != nil {
		srv.cmd.Process.Kill()
		srv.cmd.Wait()
		out, _ := os.ReadFile(logName)
		return nil, fmt.Errorf("postgres on port %d: %w; its output:\n%s", port, err, out)
	}
	return srv, nil
}

// isReady asks pg_isready (beside postgres) whether the server accepts
// connections.
func (srv *server) isReady() error {
	out, err := exec.Command(filepath.Join(srv.bin, "pg_isready"), "-t", "1", "-d", srv.dsn).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%w: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

// env is the environment of initdb and postgres: the C locale, so that
// initdb needs no other.
func env() []string { return []string{"PATH=" + os.Getenv("PATH"), "LC_ALL=C", "LANG=C"} }

// debianBins is where Debian's packages put the server's binaries, one
// directory per major version.
var debianBins = "/usr/lib/postgresql/*/bin"

// binDir returns the directory holding initdb and postgres.
func binDir() (string, error) {
	var dirs []string
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		dirs = append(dirs, strings.TrimSpace(string(out)))
	}
	// Debian: /usr/lib/postgresql/<major>/bin, newest major first.
	found, _ := filepath.Glob(debianBins)
	slices.SortFunc(found, func(a, b string) int { return major(b) - major(a) })
	dirs = append(dirs, found...)
	if p, err := exec.LookPath("initdb"); err == nil {
		dirs = append(dirs, filepath.Dir(p))
	}
	for _, d := range dirs {
		if isExec(filepath.Join(d, "initdb")) && isExec(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	return "", errNotInstalled
}

// major returns the version in a path /usr/lib/postgresql/<major>/bin.
func major(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

func isExec(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// cred is a user to run initdb and postgres as.
type cred struct{ uid, gid uint32 }

// credential returns who initdb and postgres run as: nil (this process's
// user) unless this process runs as root, which initdb refuses; then the
// user postgres when it exists (the Debian package creates it), else
// nobody.
func credential() (*cred, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	var errs []error
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil {
			errs = append(errs, fmt.Errorf("user %s: uid %q, gid %q", name, u.Uid, u.Gid))
			continue
		}
		return &cred{uid: uint32(uid), gid: uint32(gid)}, nil
	}
	return nil, fmt.Errorf("running as root, and no unprivileged user to run initdb as: %w", errors.Join(errs...))
}
