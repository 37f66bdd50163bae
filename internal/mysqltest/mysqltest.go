// Package mysqltest gives tests a real MySQL-compatible server (MariaDB or
// MySQL). It imports no driver, so that the core module can hold it and
// require no third-party module; a test module adds its driver on top
// (storage/sqlstore's tests use github.com/go-sql-driver/mysql).
//
// [DSN] returns IDEM_MYSQL_DSN when it is set. Otherwise it starts one
// private MariaDB per test binary, lazily, and shares it between the tests
// of the binary (each test uses a database of its own: [Database]). It
// looks for mariadb-install-db and mariadbd on PATH and in /usr/sbin and
// /usr/bin (Debian keeps mariadbd in /usr/sbin, which may be off a user's
// PATH). The server runs in a temporary directory (data, temporary
// files, socket, pid file, log) with --no-defaults, --skip-log-bin and no
// password for root, on a free loopback port; as root it runs with
// --user=root. Without the
// binaries the test is skipped, unless IDEM_REQUIRE_MYSQL=1 (as in CI),
// where it fails.
//
// The shared server is stopped, and its directory removed, when the tests
// end if the package's TestMain goes through [Wrap]:
//
//	func TestMain(m *testing.M) { leakcheck.Main(mysqltest.Wrap(m)) }
//
// On Linux the server also gets SIGKILL when the test binary exits, so a
// crashed test binary leaves no server running; its directory is then
// removed by the next test binary that starts a server.
//
// [StartProc] starts a server of the test's own instead, which the test
// can crash and restart (see [Proc]).
package mysqltest

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
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
	// EnvDSN names a running MySQL or MariaDB server to use instead of
	// starting one, as a github.com/go-sql-driver/mysql DSN without a
	// database name ("user:pass@tcp(host:port)/?parseTime=true"); its user
	// must be allowed to create and drop databases.
	EnvDSN = "IDEM_MYSQL_DSN"
	// EnvRequire, set to "1", turns a missing server into a failure.
	EnvRequire = "IDEM_REQUIRE_MYSQL"
)

// errNotInstalled means that no mariadb-install-db and mariadbd were
// found.
var errNotInstalled = errors.New("mysqltest: no MariaDB server binaries (mariadb-install-db, mariadbd) found " +
	"on PATH or in /usr/sbin and /usr/bin, and " + EnvDSN + " unset")

// dirPrefix starts the name of every directory a server runs in.
const dirPrefix = "idem-mysqltest-"

// binDirs are searched after PATH; a test replaces them.
var binDirs = []string{"/usr/sbin", "/usr/bin", "/usr/local/mysql/bin"}

var shared struct {
	mu   sync.Mutex
	srv  *server
	err  error
	done bool
}

// DSN returns a go-sql-driver/mysql DSN, without a database, for a real
// server: IDEM_MYSQL_DSN when set (as is), else that of a MariaDB that DSN
// starts on first use and shares with every test of the binary
// ("root@tcp(127.0.0.1:PORT)/?parseTime=true"). It skips the test when no
// server is installed, or fails it when IDEM_REQUIRE_MYSQL=1; it fails
// the test when the server is there but does not start.
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

// Exec runs statements on a server of a DSN; the caller's driver does it.
// Database uses it to create and drop the test's database.
type Exec func(query string) error

// Database returns the name of a database that no other test uses
// (idem_test_ and 16 hex digits), created with exec, and drops it when
// the test ends. exec runs a statement on a connection to [DSN]'s
// server.
func Database(t testing.TB, exec Exec) string {
	t.Helper()
	b := make([]byte, 8)
	rand.Read(b)
	name := "idem_test_" + hex.EncodeToString(b)
	if err := exec("CREATE DATABASE " + name); err != nil {
		t.Fatalf("mysqltest: creating database %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := exec("DROP DATABASE IF EXISTS " + name); err != nil {
			t.Errorf("mysqltest: dropping database %s: %v", name, err)
		}
	})
	return name
}

// WithDatabase returns dsn (as DSN returns it, "...@tcp(...)/?params")
// naming the database db.
func WithDatabase(dsn, db string) string {
	i := strings.LastIndex(dsn, "/")
	if i < 0 {
		return dsn
	}
	rest := dsn[i+1:]
	if j := strings.IndexByte(rest, '?'); j >= 0 {
		return dsn[:i+1] + db + rest[j:]
	}
	return dsn[:i+1] + db
}

func check(t testing.TB, err error) {
	t.Helper()
	switch {
	case err == nil:
	case errors.Is(err, errNotInstalled) && os.Getenv(EnvRequire) != "1":
		t.Skip(err.Error())
	case errors.Is(err, errNotInstalled):
		t.Fatal(err.Error() + ", and " + EnvRequire + "=1")
	default:
		t.Fatalf("mysqltest: %v", err)
	}
}

// M is what a TestMain runs: *testing.M, or another M wrapped.
type M = testproc.M

// Wrap returns m with a Run that runs the tests and then stops the shared
// server.
func Wrap(m M) M { return testproc.Wrap(m, stopShared) }

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
	dir string
	dsn string

	// What starts it again on the same port and data (see Proc).
	bin      string
	user     []string
	port     int
	settings []string
}

// stop ends the server (SIGTERM, a clean shutdown; SIGKILL after ten
// seconds), waits for it and removes its directory.
func (s *server) stop() {
	testproc.Stop(s.cmd, syscall.SIGTERM, 10*time.Second)
	s.removeDir()
}

// removeDir removes the server's directory.
func (s *server) removeDir() { os.RemoveAll(s.dir) }

// find returns the path of the binary name, on PATH or in binDirs.
func find(name string) (string, bool) {
	if p, err := exec.LookPath(name); err == nil {
		return p, true
	}
	for _, d := range binDirs {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, true
		}
	}
	return "", false
}

// start finds the binaries, runs mariadb-install-db, and starts mariadbd
// on a free loopback port, with settings ("name=value", each passed as
// --name=value) after the package's own, which they override. A port
// taken between choosing it and the server binding it makes the server
// exit, so it tries a few ports.
func start(settings []string) (*server, error) {
	install, ok1 := find("mariadb-install-db")
	mariadbd, ok2 := find("mariadbd")
	if !ok1 || !ok2 {
		return nil, errNotInstalled
	}
	testproc.Sweep(dirPrefix)
	dir, err := os.MkdirTemp("", dirPrefix+"*")
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*server, error) {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := testproc.WriteOwner(dir); err != nil {
		return fail(err)
	}
	user := []string{}
	if os.Geteuid() == 0 {
		user = []string{"--user=root"}
	}
	data := filepath.Join(dir, "data")
	// A temporary directory of the server's own: the bootstrap's temporary
	// tables in the shared /tmp collide with another test binary's
	// bootstrap running at the same time ("Could not remove temporary
	// table", then "Unknown table 'mysql.tmp_proxies_priv'": seen when
	// go test started four packages' servers at once).
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return fail(err)
	}
	args := append([]string{"--no-defaults"}, user...)
	args = append(args, "--datadir="+data, "--tmpdir="+tmp, "--auth-root-authentication-method=normal", "--skip-test-db")
	cmd := exec.Command(install, args...)
	cmd.Env = env()
	if out, err := cmd.CombinedOutput(); err != nil {
		return fail(fmt.Errorf("mariadb-install-db in %s: %w; its output:\n%s", dir, err, out))
	}
	srv, err := testproc.OnFreePort(3, func(port int) (*server, error) {
		return startAt(mariadbd, dir, user, port, settings)
	})
	if err != nil {
		return fail(err)
	}
	return srv, nil
}

// startAt runs mariadbd on the data directory in dir, on the loopback
// port, and waits until it accepts connections. Its output is appended to
// dir's mariadbd.log, so that the log of a restarted server (see Proc)
// follows the first's.
func startAt(mariadbd, dir string, user []string, port int, settings []string) (*server, error) {
	logName := filepath.Join(dir, "mariadbd.log")
	log, err := os.OpenFile(logName, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	args := append([]string{"--no-defaults"}, user...)
	args = append(args, "--datadir="+filepath.Join(dir, "data"), "--tmpdir="+filepath.Join(dir, "tmp"), "--socket="+filepath.Join(dir, "sock"),
		"--pid-file="+filepath.Join(dir, "pid"), "--port="+strconv.Itoa(port), "--bind-address=127.0.0.1",
		"--skip-log-bin", "--innodb-flush-log-at-trx-commit=0", "--max-connections=300",
		"--innodb-buffer-pool-size=64M")
	for _, kv := range settings {
		args = append(args, "--"+kv) // the last of an option wins
	}
	srv := &server{dir: dir, cmd: exec.Command(mariadbd, args...), bin: mariadbd, user: user, port: port, settings: settings,
		dsn: "root@tcp(" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) + ")/?parseTime=true"}
	srv.cmd.Env = env()
	srv.cmd.Stdout, srv.cmd.Stderr = log, log
	srv.cmd.SysProcAttr = sysProcAttr()
	if err := srv.cmd.Start(); err != nil {
		return nil, err
	}
	if err := testproc.WaitReady(srv.cmd, 60*time.Second, func() error { return greeting(port) }); err != nil {
		srv.cmd.Process.Kill()
		srv.cmd.Wait()
		out, _ := os.ReadFile(logName)
		return nil, fmt.Errorf("mariadbd on port %d: %w; its output:\n%s", port, err, out)
	}
	return srv, nil
}

// greeting reads the server's first packet on a new connection: a 4-byte
// header and then protocol version 10 (an error packet, 0xff, while the
// server is not ready).
func greeting(port int) error {
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	var b [5]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return err
	}
	if b[4] != 10 {
		return fmt.Errorf("greeting starts with %#x, want protocol version 10", b[4])
	}
	return nil
}

func env() []string { return []string{"PATH=" + os.Getenv("PATH"), "LC_ALL=C", "LANG=C", "TZ=UTC"} }
