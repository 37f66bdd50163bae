package redistest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// Environment variables that choose the server binaries.
const (
	// EnvServer names the server binary that every server of this package
	// runs (the shared one, Start's, StartProc's, the cluster's, the
	// sentinel's), instead of redis-server from PATH: a path such as
	// ~/.cache/idem-valkey/bin/valkey-server, so that a whole test run
	// goes to Valkey. The client (redis-cli, for the cluster) is the one
	// beside it, its name with "server" changed to "cli".
	EnvServer = "IDEM_REDIS_SERVER"
	// EnvValkey names the valkey-server binary that [StartValkey] runs;
	// without it, StartValkey takes valkey-server from PATH, then from
	// ~/.cache/idem-valkey/bin (where ../shared/tools/valkey.sh puts it).
	EnvValkey = "IDEM_VALKEY_SERVER"
	// EnvRequireValkey, set to "1", turns a missing valkey-server into a
	// failure of the tests that need one.
	EnvRequireValkey = "IDEM_REQUIRE_VALKEY"
)

// serverBin returns the server binary: IDEM_REDIS_SERVER, or
// redis-server from PATH.
func serverBin() (string, error) {
	if p := os.Getenv(EnvServer); p != "" {
		return explicit(p)
	}
	return exec.LookPath("redis-server")
}

// cliBin returns the client binary that goes with the server binary.
func cliBin() (string, error) {
	p := os.Getenv(EnvServer)
	if p == "" {
		return exec.LookPath("redis-cli")
	}
	dir, name := filepath.Split(p)
	return explicit(filepath.Join(dir, strings.Replace(name, "server", "cli", 1)))
}

// valkeyBin returns the valkey-server binary that StartValkey runs.
func valkeyBin() (string, error) {
	if p := os.Getenv(EnvValkey); p != "" {
		return explicit(p)
	}
	if p, err := exec.LookPath("valkey-server"); err == nil {
		return p, nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", exec.ErrNotFound
	}
	if p, err := exec.LookPath(filepath.Join(cache, "idem-valkey", "bin", "valkey-server")); err == nil {
		return p, nil
	}
	return "", exec.ErrNotFound
}

// valkey is the server that ValkeyAddr starts for the whole test binary.
var valkey struct {
	mu   sync.Mutex
	srv  *server
	err  error
	done bool
}

// ValkeyAddr returns the address of a valkey-server (see EnvValkey for
// which binary) that it starts on first use and shares with every test
// of the binary, as [Addr] shares its redis-server; [Wrap] stops it. It
// skips or fails the test like [StartValkey].
func ValkeyAddr(t testing.TB) string {
	t.Helper()
	valkey.mu.Lock()
	defer valkey.mu.Unlock()
	if !valkey.done {
		valkey.done = true
		var bin string
		if bin, valkey.err = valkeyBin(); valkey.err == nil {
			valkey.srv, valkey.err = startValkey(bin)
		}
	}
	checkValkey(t, valkey.err)
	return valkey.srv.addr
}

// stopValkey stops the shared valkey-server, if ValkeyAddr started one.
func stopValkey() {
	valkey.mu.Lock()
	defer valkey.mu.Unlock()
	if valkey.srv != nil {
		valkey.srv.stop()
	}
	valkey.srv, valkey.err, valkey.done = nil, nil, false
}

// startValkey starts bin on a free loopback port, trying a few.
func startValkey(bin string, args ...string) (srv *server, err error) {
	for attempt := 1; ; attempt++ {
		if srv, err = startOn(bin, args); err == nil || attempt == 3 {
			return srv, err
		}
	}
}

// checkValkey skips or fails t for an error finding or starting Valkey.
func checkValkey(t testing.TB, err error) {
	t.Helper()
	switch {
	case err == nil:
	case errors.Is(err, exec.ErrNotFound) && os.Getenv(EnvRequireValkey) != "1":
		t.Skipf("redistest: no valkey-server (%s, PATH, ~/.cache/idem-valkey/bin): ../shared/tools/valkey.sh installs one", EnvValkey)
	case errors.Is(err, exec.ErrNotFound):
		t.Fatalf("redistest: no valkey-server (%s, PATH, ~/.cache/idem-valkey/bin), and %s=1", EnvValkey, EnvRequireValkey)
	default:
		t.Fatalf("redistest: %v", err)
	}
}

// StartValkey starts a valkey-server of the test's own (see EnvValkey for
// which binary), with extra command-line arguments, and returns its
// address; it is killed when the test ends. Without a valkey-server the
// test is skipped, or fails when IDEM_REQUIRE_VALKEY=1. It is for the
// tests of what only Valkey 8.1 and newer do (SET IFEQ); to run a whole
// suite on Valkey, set IDEM_REDIS_SERVER instead.
func StartValkey(t testing.TB, args ...string) string {
	t.Helper()
	bin, err := valkeyBin()
	var srv *server
	if err == nil {
		srv, err = startValkey(bin, args...)
	}
	checkValkey(t, err)
	t.Cleanup(srv.stop)
	return srv.addr
}

// explicit looks up a binary that an environment variable names: a
// missing one is an error of the run's setup, which fails the test
// rather than skipping it (the error does not wrap exec.ErrNotFound).
func explicit(p string) (string, error) {
	bin, err := exec.LookPath(p)
	if err != nil {
		return "", fmt.Errorf("%s", err)
	}
	return bin, nil
}
