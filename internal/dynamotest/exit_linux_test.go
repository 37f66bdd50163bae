package dynamotest

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
// that starts the shared server and exits without stopping it: the server
// must go away on its own (Pdeathsig, through the "#!/usr/bin/env node"
// of npm's dynalite), and the next start must remove its directory.
func TestServerGoneWhenBinaryExits(t *testing.T) {
	if os.Getenv(EnvEndpoint) != "" {
		t.Skip("the server of " + EnvEndpoint + " is not dynamotest's")
	}
	Endpoint(t) // skips or fails as Endpoint does when dynalite is missing
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperExitWithServer$", "-test.count=1")
	cmd.Env = append(os.Environ(), "DYNAMOTEST_HELPER=exit")
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
			t.Fatalf("dynalite (pid %d) still running 20s after its test binary exited", pid)
		}
		time.Sleep(20 * time.Millisecond) // another process: nothing to wait on but time
	}
	if _, err := os.Stat(dir); os.IsNotExist(err) {
		t.Logf("the helper's directory %s was swept by another process", dir)
		return
	}
	testproc.Sweep(dirPrefix)
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		os.RemoveAll(dir)
		t.Fatalf("after sweep, the directory of the exited binary's server is still there (%v)", err)
	}
}

// TestHelperExitWithServer is the helper of TestServerGoneWhenBinaryExits.
func TestHelperExitWithServer(t *testing.T) {
	if os.Getenv("DYNAMOTEST_HELPER") != "exit" {
		t.Skip("a helper of TestServerGoneWhenBinaryExits")
	}
	Endpoint(t)
	fmt.Printf("server %d %s\n", shared.srv.cmd.Process.Pid, shared.srv.dir)
	os.Exit(0)
}
