//go:build !linux

package mysqltest

import "syscall"

// sysProcAttr: elsewhere there is no parent-death signal; the server is
// stopped by Wrap.
func sysProcAttr() *syscall.SysProcAttr { return nil }
