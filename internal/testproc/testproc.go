// Package testproc holds what the packages that start a server for the
// tests (internal/mysqltest, internal/pgtest) share: the owner file and
// sweep of their temporary directories, a free loopback port and the
// retries of a start on one, the wait for a server that may exit while
// starting, its stop, whether a process exited or is alive, and the
// wrapper of a TestMain that stops a shared server.
package testproc

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ownerFile, in a server's directory, holds the pid of the test binary
// that started the server.
const ownerFile = "owner"

// WriteOwner writes this test binary's pid into dir, for [Sweep]: a
// directory whose binary is gone is removed by the next one.
func WriteOwner(dir string) error {
	return os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644)
}

// Sweep removes the directories of the temporary directory whose names
// start with prefix and whose test binary is gone (it crashed, or its
// package never stopped the shared server). A directory is removed only
// when it names its binary's pid ([WriteOwner]) and no such process
// exists; one without an owner file is not ours, or being created.
func Sweep(prefix string) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), prefix+"*"))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, ownerFile))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 || Alive(pid) {
			continue
		}
		os.RemoveAll(d)
	}
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// OnFreePort runs start on a free port ([FreePort]) and returns what it
// returns, trying other ports up to tries times in all while it fails: a
// port taken between choosing it and the server binding it makes the
// server exit.
func OnFreePort[S any](tries int, start func(port int) (S, error)) (S, error) {
	for attempt := 1; ; attempt++ {
		port, err := FreePort()
		if err != nil {
			var zero S
			return zero, err
		}
		s, err := start(port)
		if err == nil || attempt >= tries {
			return s, err
		}
	}
}

// WaitReady calls ready until it returns nil, cmd's process exits, or
// timeout passes; it returns nil, or why the server is not ready.
func WaitReady(cmd *exec.Cmd, timeout time.Duration, ready func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := ready()
		if err == nil {
			return nil
		}
		if Exited(cmd) {
			return fmt.Errorf("exited: %w", err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v: %w", timeout, err)
		}
		time.Sleep(20 * time.Millisecond) // another process: nothing to wait on but time
	}
}

// Stop sends sig to cmd's process, kills it (SIGKILL) if it has not
// exited after grace, and waits for it.
func Stop(cmd *exec.Cmd, sig syscall.Signal, grace time.Duration) {
	cmd.Process.Signal(sig)
	kill := time.AfterFunc(grace, func() { cmd.Process.Kill() })
	cmd.Wait()
	kill.Stop()
}

// M is what a TestMain runs: *testing.M, or another M wrapped (the same
// as leakcheck.M).
type M interface{ Run() int }

// Wrap returns m with a Run that runs the tests and then calls stop.
func Wrap(m M, stop func()) M { return wrapped{m, stop} }

type wrapped struct {
	m    M
	stop func()
}

func (w wrapped) Run() int {
	defer w.stop()
	return w.m.Run()
}
