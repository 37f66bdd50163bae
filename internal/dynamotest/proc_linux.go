package dynamotest

import (
	"fmt"
	"os/exec"
	"syscall"
)

// sysProcAttr has the kernel kill the server when the test binary exits
// (strictly, when the thread that started it exits; the Go runtime keeps
// its threads unless a goroutine exits while locked to one). npm's
// dynalite is a "#!/usr/bin/env node" script: env execs node in the same
// process, which keeps the signal.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// pause sends SIGSTOP to cmd's process and waits until it has stopped
// (every thread of node's), or exited (it is then reaped, and a later
// cmd.Wait fails).
func pause(cmd *exec.Cmd) error {
	pid := cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return err
	}
	for {
		var ws syscall.WaitStatus
		_, err := syscall.Wait4(pid, &ws, syscall.WUNTRACED, nil)
		switch {
		case err == syscall.EINTR:
		case err != nil:
			return err
		case ws.Stopped():
			return nil
		case ws.Exited() || ws.Signaled():
			return fmt.Errorf("the server exited (wait status %#x) instead of stopping", uint32(ws))
		}
	}
}

// resume sends SIGCONT to cmd's process.
func resume(cmd *exec.Cmd) error { return syscall.Kill(cmd.Process.Pid, syscall.SIGCONT) }
