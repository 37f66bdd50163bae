//go:build unix && !linux

package e2e

import "syscall"

// sysProcAttr: elsewhere there is no parent-death signal; the servers are
// killed by the tests' cleanup.
func sysProcAttr() *syscall.SysProcAttr { return nil }
