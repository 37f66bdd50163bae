package testproc

import (
	"os/exec"
	"syscall"
)

// Exited reports whether cmd's process has exited, reaping it if so (a
// later cmd.Wait then fails, and its error is ignored).
func Exited(cmd *exec.Cmd) bool {
	var ws syscall.WaitStatus
	pid, err := syscall.Wait4(cmd.Process.Pid, &ws, syscall.WNOHANG, nil)
	return pid == cmd.Process.Pid || err == syscall.ECHILD
}

// Alive reports whether a process with this pid exists.
func Alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || err == syscall.EPERM
}
