//go:build unix && !linux

package main

import "syscall"

// sysProcAttr: no parent-death signal outside Linux; the tests kill their
// processes at cleanup.
func sysProcAttr() *syscall.SysProcAttr { return nil }
