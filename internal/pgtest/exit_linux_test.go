package pgtest

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/testproc"
)

// TestServerGoneWhenBinaryExits runs this test binary again, as a helper
// that starts the shared server and exits without stopping it (as a test
// binary whose TestMain does not go through Main or Wrap does): the server
// must go away on its own, and the next start must remove its directory.
func TestServerGoneWhenBinaryExits(t *testing.T) {
	if os.Getenv(EnvDSN) != "" {
		t.Skip("the server of " + EnvDSN + " is not pgtest's")
	}
	DSN(t) // skips or fails as DSN does when PostgreSQL is missing
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperExitWithServer$", "-test.count=1")
	cmd.Env = append(os.Environ(), "PGTEST_HELPER=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helper: %v; its output:\n%s", err, out)
	}
	var pid int
	var dir string
	for sc := bufio.NewScanner(strings.NewReader(string(out))); sc.Scan(); {
		if f := strings.Fields(sc.Text()); len(f) == 3 && f[0] == "server" {
			pid, _ = strconv.Atoi(f[1])
			dir = f[2]
		}
	}
	if pid == 0 {
		t.Fatalf("the helper did not report its server; its output:\n%s", out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for testproc.Alive(pid) {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			os.RemoveAll(dir)
			t.Fatalf("postgres (pid %d) still running 20s after its test binary exited", pid)
		}
		time.Sleep(20 * time.Millisecond) // another process: nothing to wait on but time
	}
	if _, err := os.Stat(dir); os.IsNotExist(err) {
		// Another test binary of the same `go test` run started its server
		// meanwhile, and its sweep took the directory first.
		t.Logf("the helper's directory %s was swept by another process", dir)
		return
	} else if err != nil {
		t.Fatalf("the helper's directory %s: %v, want it left for sweep", dir, err)
	}
	testproc.Sweep(dirPrefix)
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		os.RemoveAll(dir)
		t.Fatalf("after sweep, the directory of the exited binary's server is still there (%v)", err)
	}
}

// TestHelperExitWithServer is the helper of TestServerGoneWhenBinaryExits.
func TestHelperExitWithServer(t *testing.T) {
	if os.Getenv("PGTEST_HELPER") != "1" {
		t.Skip("a helper of TestServerGoneWhenBinaryExits")
	}
	DSN(t)
	fmt.Printf("server %d %s\n", shared.srv.cmd.Process.Pid, shared.srv.dir)
	os.Exit(0)
}
