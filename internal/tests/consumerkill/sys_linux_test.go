package consumerkill

import "syscall"

// sysProcAttr has the kernel kill a consumer when the test binary exits, so
// that a test binary that crashes or times out leaves none behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
