package testproc

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

// deadPid returns the pid of a process that has exited.
func deadPid(t *testing.T) int {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

// TestSweep: a directory whose owner is gone is removed; one whose owner
// lives, one without an owner and one of another prefix are kept.
func TestSweep(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("Alive is known on Linux only")
	}
	prefix := "idem-testproc-test-" + strconv.Itoa(os.Getpid()) + "-"
	mk := func(name string, owner int) string {
		dir := filepath.Join(os.TempDir(), name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		if owner > 0 {
			if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(owner)), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	gone := mk(prefix+"gone", deadPid(t))
	mine := mk(prefix+"mine", 0)
	if err := WriteOwner(mine); err != nil {
		t.Fatal(err)
	}
	creating := mk(prefix+"creating", 0)
	other := mk("idem-testproc-other-"+strconv.Itoa(os.Getpid()), deadPid(t))
	Sweep(prefix)
	for dir, kept := range map[string]bool{gone: false, mine: true, creating: true, other: true} {
		if _, err := os.Stat(dir); (err == nil) != kept {
			t.Errorf("%s after Sweep: %v, want kept %t", filepath.Base(dir), err, kept)
		}
	}
}

func TestAlive(t *testing.T) {
	if !Alive(os.Getpid()) {
		t.Error("this process is not alive")
	}
	if runtime.GOOS == "linux" && Alive(deadPid(t)) {
		t.Error("an exited process is alive")
	}
}

// TestOnFreePort: start gets free ports and is tried again while it
// fails, up to tries times.
func TestOnFreePort(t *testing.T) {
	var ports []int
	fail := errors.New("taken")
	got, err := OnFreePort(3, func(port int) (int, error) {
		ports = append(ports, port)
		if len(ports) < 2 {
			return 0, fail
		}
		return port, nil
	})
	if err != nil || len(ports) != 2 || got != ports[1] || ports[0] <= 0 {
		t.Errorf("OnFreePort: %d, %v after ports %v; want the second port", got, err, ports)
	}
	n := 0
	if _, err := OnFreePort(3, func(int) (int, error) { n++; return 0, fail }); !errors.Is(err, fail) || n != 3 {
		t.Errorf("OnFreePort always failing: %v after %d tries, want %v after 3", err, n, fail)
	}
}

// TestWaitReady: ready once it answers; an error naming the exit when the
// process exits first; one naming the timeout when it outlives it.
func TestWaitReady(t *testing.T) {
	notYet := errors.New("not yet")
	sleeper := func() *exec.Cmd {
		cmd := exec.Command("sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Skip("no sleep command: ", err)
		}
		t.Cleanup(func() { Stop(cmd, syscall.SIGKILL, time.Second) })
		return cmd
	}
	n := 0
	if err := WaitReady(sleeper(), time.Minute, func() error {
		if n++; n < 3 {
			return notYet
		}
		return nil
	}); err != nil || n != 3 {
		t.Errorf("WaitReady: %v after %d calls, want nil after 3", err, n)
	}
	if err := WaitReady(sleeper(), 50*time.Millisecond, func() error { return notYet }); !errors.Is(err, notYet) {
		t.Errorf("WaitReady past its timeout: %v, want %v", err, notYet)
	}
	if runtime.GOOS != "linux" {
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	err := WaitReady(cmd, time.Minute, func() error { return notYet })
	if !errors.Is(err, notYet) || err.Error() != "exited: not yet" {
		t.Errorf("WaitReady of a process that exits: %v, want exited: not yet", err)
	}
	cmd.Wait()
}

// TestStop: a process that ignores the signal is killed after the grace.
func TestStop(t *testing.T) {
	cmd := exec.Command("sh", "-c", "trap '' TERM; echo ignoring; exec sleep 60")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Skip("no sh: ", err)
	}
	// SIGTERM is ignored from here on.
	if line, err := bufio.NewReader(out).ReadString('\n'); line != "ignoring\n" {
		Stop(cmd, syscall.SIGKILL, time.Second)
		t.Fatalf("sh said %q, %v", line, err)
	}
	begin := time.Now()
	Stop(cmd, syscall.SIGTERM, 200*time.Millisecond)
	if cmd.ProcessState == nil || time.Since(begin) < 200*time.Millisecond {
		t.Errorf("Stop returned after %v with %v, want the process killed after the grace", time.Since(begin), cmd.ProcessState)
	}
}

type runs struct{ n *int }

func (r runs) Run() int { *r.n++; return 7 }

// TestWrap: Run runs the tests, then stop, and returns their code.
func TestWrap(t *testing.T) {
	ran, stopped := 0, 0
	code := Wrap(runs{&ran}, func() {
		if ran != 1 {
			t.Error("stop before the tests")
		}
		stopped++
	}).Run()
	if code != 7 || ran != 1 || stopped != 1 {
		t.Errorf("Run: code %d, tests run %d times, stop %d; want 7, 1, 1", code, ran, stopped)
	}
}
