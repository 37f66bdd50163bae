//go:build !linux

package pgtest

import "syscall"

// sysProcAttr: elsewhere there is no parent-death signal, and no switch of
// user (credential asks for one under root only); the server is stopped by
// Wrap or Main.
func sysProcAttr(*cred) *syscall.SysProcAttr { return nil }
