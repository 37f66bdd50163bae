//go:build !linux

package pgtest

import (
	"os/exec"
	"syscall"
)

// sysProcAttr: elsewhere there is no parent-death signal, and no switch of
// user (credential asks for one under root only); the server is stopped by
// Wrap or Main.
func sysProcAttr(*cred) *syscall.SysProcAttr { return nil }

// exited is not known without waiting: startAt waits for its timeout.
func exited(*exec.Cmd) bool { return false }

// alive: without a portable check every directory is taken as in use, and
// sweep removes none.
func alive(int) bool { return true }
