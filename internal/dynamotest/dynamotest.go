// Package dynamotest gives tests a real DynamoDB API, served by dynalite
// (the npm package dynalite, version 4: the DynamoDB API in Node.js, kept
// in memory or in LevelDB). It imports no AWS SDK, so that the core module
// can hold it and require no third-party module; a test module adds its
// SDK on top.
//
// [Endpoint] returns IDEM_DYNAMODB_ENDPOINT when it is set (DynamoDB
// Local, say). Otherwise it starts one dynalite per test binary, lazily,
// in memory, and shares it between the tests of the binary (each test
// uses tables of its own: [Table]). It runs the dynalite that
// IDEM_DYNALITE names, else dynalite from PATH, else
// ~/.cache/idem-dynalite/node_modules/.bin/dynalite, where
//
//	npm install --prefix ~/.cache/idem-dynalite dynalite@4.0.0
//
// puts it; npm's dynalite is a script of node's, which must be on PATH.
// The server listens on a free loopback port, with tables created,
// updated and deleted at once: CreateTable still answers CREATING, as
// DynamoDB does, but the table is ACTIVE right after, so an SDK's waiter
// returns at its first DescribeTable. It runs in a temporary directory
// that holds its log. Without dynalite the test is skipped, unless
// IDEM_REQUIRE_DYNAMODB=1 (as in CI), where it fails.
//
// dynalite wants an Authorization header of AWS Signature Version 4 form
// on every request (without one it answers 400,
// MissingAuthenticationTokenException) but checks neither the signature
// nor the credentials nor the region, so an SDK with any static
// credentials and any region will do. Its tables are not kept apart by
// credentials or region.
//
// The shared server is stopped, and its directory removed, when the tests
// end if the package's TestMain goes through [Wrap]:
//
//	func TestMain(m *testing.M) { leakcheck.Main(dynamotest.Wrap(m)) }
//
// On Linux the server also gets SIGKILL when the test binary exits, so a
// crashed test binary leaves no server running; its directory is then
// removed by the next test binary that starts a server.
//
// [StartProc] starts a server of the test's own instead, kept in LevelDB,
// which the test can kill, restart and pause (see [Proc]).
package dynamotest

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
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

// Environment variables read by [Endpoint] and [StartProc].
const (
	// EnvEndpoint names a running DynamoDB-compatible endpoint to use
	// instead of starting dynalite, as a URL ("http://127.0.0.1:8000" for
	// DynamoDB Local). StartProc does not use it.
	EnvEndpoint = "IDEM_DYNAMODB_ENDPOINT"
	// EnvRequire, set to "1", turns a missing dynalite (or node) into a
	// failure.
	EnvRequire = "IDEM_REQUIRE_DYNAMODB"
	// EnvDynalite names the dynalite executable to run instead of looking
	// for one on PATH and in ~/.cache/idem-dynalite. One that it names and
	// that is not there fails the test, even without EnvRequire.
	EnvDynalite = "IDEM_DYNALITE"
)

// cacheBin is where the default install puts dynalite, under the home
// directory.
const cacheBin = ".cache/idem-dynalite/node_modules/.bin/dynalite"

// errNotInstalled is what the errors of a missing dynalite or node match:
// check skips the test on it, or fails it under EnvRequire.
var errNotInstalled = errors.New("dynalite is not installed")

// errNotFound means that no dynalite was found.
var errNotFound = fmt.Errorf("%w: %s and %s unset, and no dynalite on PATH or at ~/%s; "+
	"`npm install --prefix ~/.cache/idem-dynalite dynalite@4.0.0` installs it (it needs node on PATH)",
	errNotInstalled, EnvEndpoint, EnvDynalite, cacheBin)

// dirPrefix starts the name of every directory a server runs in.
const dirPrefix = "idem-dynamotest-"

// logName is the server's log, in its directory.
const logName = "dynalite.log"

// readyTimeout bounds a start; dynalite answers about 0.3s after it is
// started, on an idle machine.
const readyTimeout = 30 * time.Second

var shared struct {
	mu   sync.Mutex
	srv  *server
	err  error
	done bool
}

// Endpoint returns the URL of a DynamoDB API: IDEM_DYNAMODB_ENDPOINT when
// set (as is), else that of a dynalite that Endpoint starts on first use,
// in memory, and shares with every test of the binary
// ("http://127.0.0.1:PORT"). It skips the test when dynalite or node is
// not installed, or fails it when IDEM_REQUIRE_DYNAMODB=1; it fails the
// test when IDEM_DYNALITE names no executable, or when dynalite is there
// but does not start (with its output in the message).
func Endpoint(t testing.TB) string {
	t.Helper()
	if e := os.Getenv(EnvEndpoint); e != "" {
		return e
	}
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if !shared.done {
		shared.done = true
		shared.srv, shared.err = start(false)
	}
	check(t, shared.err)
	return shared.srv.endpoint
}

// Table returns the name of a table that no other test uses (idem_test_
// and 16 hex digits). It creates nothing: the test creates the table with
// its SDK, and need not delete it, since the shared server is discarded
// when the tests end.
func Table(t testing.TB) string {
	t.Helper()
	b := make([]byte, 8)
	rand.Read(b)
	return "idem_test_" + hex.EncodeToString(b)
}

// check skips or fails t for an error finding or starting dynalite.
func check(t testing.TB, err error) {
	t.Helper()
	switch {
	case err == nil:
	case errors.Is(err, errNotInstalled) && os.Getenv(EnvRequire) != "1":
		t.Skip("dynamotest: " + err.Error())
	case errors.Is(err, errNotInstalled):
		t.Fatal("dynamotest: " + err.Error() + "; and " + EnvRequire + "=1")
	default:
		t.Fatalf("dynamotest: %v", err)
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
	cmd      *exec.Cmd
	dir      string
	endpoint string

	// What starts it again on the same port and data (see Proc).
	bin     string
	port    int
	persist bool
}

// stop ends the server (SIGCONT, should it be paused, then SIGTERM, at
// which node exits; SIGKILL after five seconds), waits for it and removes
// its directory.
func (s *server) stop() {
	resume(s.cmd)
	testproc.Stop(s.cmd, syscall.SIGTERM, 5*time.Second)
	s.removeDir()
}

// removeDir removes the server's directory.
func (s *server) removeDir() { os.RemoveAll(s.dir) }

// find returns the path of dynalite: IDEM_DYNALITE, else dynalite on
// PATH, else the one under ~/.cache/idem-dynalite. The error of one that
// is not found, or that is a node script without node on PATH, matches
// errNotInstalled; that of an IDEM_DYNALITE that names no executable does
// not.
func find() (string, error) {
	if p := os.Getenv(EnvDynalite); p != "" {
		bin, err := exec.LookPath(p)
		if err != nil {
			return "", fmt.Errorf("%s=%s: %v", EnvDynalite, p, err)
		}
		return needsNode(bin)
	}
	if bin, err := exec.LookPath("dynalite"); err == nil {
		return needsNode(bin)
	}
	if home, err := os.UserHomeDir(); err == nil && home != "" {
		if bin, err := exec.LookPath(filepath.Join(home, cacheBin)); err == nil {
			return needsNode(bin)
		}
	}
	return "", errNotFound
}

// needsNode returns bin, or an error matching errNotInstalled when bin is
// a script run by node ("#!/usr/bin/env node", as npm installs dynalite)
// and node is not on PATH.
func needsNode(bin string) (string, error) {
	f, err := os.Open(bin)
	if err != nil {
		return "", err
	}
	defer f.Close()
	head := make([]byte, 256)
	n, _ := io.ReadFull(f, head)
	line, _, _ := strings.Cut(string(head[:n]), "\n")
	if !strings.HasPrefix(line, "#!") || !strings.Contains(line, "node") {
		return bin, nil
	}
	if _, err := exec.LookPath("node"); err != nil {
		return "", fmt.Errorf("%w: %s is a script of node's, and node is not on PATH", errNotInstalled, bin)
	}
	return bin, nil
}

// start finds dynalite and starts it in a new directory on a free loopback
// port, in memory or, with persist, in LevelDB in the directory's data. A
// port taken between choosing it and the server binding it makes the
// server exit, so it tries a few ports.
func start(persist bool) (*server, error) {
	bin, err := find()
	if err != nil {
		return nil, err
	}
	testproc.Sweep(dirPrefix)
	dir, err := os.MkdirTemp("", dirPrefix+"*")
	if err != nil {
		return nil, err
	}
	if err := testproc.WriteOwner(dir); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	srv, err := testproc.OnFreePort(3, func(port int) (*server, error) {
		return startAt(bin, dir, port, persist)
	})
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return srv, nil
}

// startAt runs dynalite in dir on the loopback port, with its LevelDB in
// dir's data if persist, and waits until it answers HTTP. Its output is
// appended to dir's dynalite.log, so that the log of a restarted server
// (see Proc) follows the first's.
func startAt(bin, dir string, port int, persist bool) (*server, error) {
	logPath := filepath.Join(dir, logName)
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	args := []string{"--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"--createTableMs", "0", "--deleteTableMs", "0", "--updateTableMs", "0"}
	if persist {
		args = append(args, "--path", filepath.Join(dir, "data"))
	}
	srv := &server{dir: dir, cmd: exec.Command(bin, args...), bin: bin, port: port, persist: persist,
		endpoint: "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
	srv.cmd.Dir = dir
	srv.cmd.Env = env()
	srv.cmd.Stdout, srv.cmd.Stderr = log, log
	srv.cmd.SysProcAttr = sysProcAttr()
	if err := srv.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	if err := testproc.WaitReady(srv.cmd, readyTimeout, func() error { return answers(srv.endpoint) }); err != nil {
		srv.cmd.Process.Kill()
		srv.cmd.Wait()
		out, _ := os.ReadFile(logPath)
		return nil, fmt.Errorf("%s on port %d: %w; its output:\n%s", bin, port, err, out)
	}
	return srv, nil
}

// probe is the client of answers: no proxy, and no connection kept, so
// that none outlives the probe (leakcheck would see its goroutines).
var probe = &http.Client{
	Timeout:   2 * time.Second,
	Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true},
}

// answers posts an unsigned ListTables to endpoint: any HTTP answer means
// the server is up (dynalite's is a 400, MissingAuthenticationTokenException).
func answers(endpoint string) error {
	req, err := http.NewRequest(http.MethodPost, endpoint, strings.NewReader("{}"))
	if err != nil {
		return err
	}
	req.Header.Set("X-Amz-Target", "DynamoDB_20120810.ListTables")
	req.Header.Set("Content-Type", "application/x-amz-json-1.0")
	resp, err := probe.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return nil
}

// env is the server's environment: PATH alone, for its
// "#!/usr/bin/env node" to find node; no NODE_OPTIONS or the like of the
// user's.
func env() []string { return []string{"PATH=" + os.Getenv("PATH")} }
