package mysqltest

import (
	"os/exec"
	"syscall"
)

// sysProcAttr has the kernel kill the server when the test binary exits
// (strictly, when the thread that started it exits; the Go runtime keeps
// its threads unless a goroutine exits while locked to one).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// exited reports whether cmd's process has exited, reaping it if so.
func exited(cmd *exec.Cmd) bool {
	var ws syscall.WaitStatus
	pid, err := syscall.Wait4(cmd.Process.Pid, &ws, syscall.WNOHANG, nil)
	return pid == cmd.Process.Pid || err == syscall.ECHILD
}

// alive reports whether a process with this pid exists.
func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || err == syscall.EPERM
}
