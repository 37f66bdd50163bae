package pgtest

import "syscall"

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
