//go:build !linux

package redistest

import "syscall"

// sysProcAttr: elsewhere there is no parent-death signal; the server is
// stopped by Wrap, Main or the test's cleanup.
func sysProcAttr() *syscall.SysProcAttr { return nil }
