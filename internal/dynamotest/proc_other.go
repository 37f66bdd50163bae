//go:build !linux

package dynamotest

import (
	"os/exec"
	"syscall"
)

// sysProcAttr: elsewhere there is no parent-death signal; the server is
// stopped by Wrap.
func sysProcAttr() *syscall.SysProcAttr { return nil }

// pause is not implemented: Pause skips the test.
func pause(*exec.Cmd) error { return errNoPause }

// resume: nothing is paused.
func resume(*exec.Cmd) error { return errNoPause }
