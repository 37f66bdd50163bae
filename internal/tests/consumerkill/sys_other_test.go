//go:build unix && !linux

package consumerkill

import "syscall"

// sysProcAttr: elsewhere there is no parent-death signal; the consumers are
// killed by the tests' cleanup.
func sysProcAttr() *syscall.SysProcAttr { return nil }
