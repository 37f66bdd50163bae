//go:build !linux

package mysqltest

import (
	"os/exec"
	"syscall"
)

// sysProcAttr: elsewhere there is no parent-death signal; the server is
// stopped by Wrap.
func sysProcAttr() *syscall.SysProcAttr { return nil }

// exited is not known without waiting: startAt waits for its timeout.
func exited(*exec.Cmd) bool { return false }

// alive: every directory is taken as in use, and sweep removes none.
func alive(int) bool { return true }
