package pgtest

import (
	"os/exec"
	"syscall"
)

// sysProcAttr runs the process as cred (nil: as this process's user) and
// has the kernel send it SIGQUIT, PostgreSQL's immediate shutdown, when
// the test binary exits. (Strictly, when the thread that started it exits;
// the Go runtime keeps its threads unless a goroutine exits while locked to
// one.) Go sets the parent-death signal after switching to cred, so the
// switch does not clear it.
func sysProcAttr(c *cred) *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Pdeathsig: syscall.SIGQUIT}
	if c != nil {
		a.Credential = &syscall.Credential{Uid: c.uid, Gid: c.gid}
	}
	return a
}

// exited reports whether cmd's process has exited, reaping it if so (a
// later cmd.Wait then fails, and its error is ignored).
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
