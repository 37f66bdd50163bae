package mysqltest

import "syscall"

// sysProcAttr has the kernel kill the server when the test binary exits
// (strictly, when the thread that started it exits; the Go runtime keeps
// its threads unless a goroutine exits while locked to one).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
