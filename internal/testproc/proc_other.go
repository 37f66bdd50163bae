//go:build !linux

package testproc

import "os/exec"

// Exited is not known without waiting: WaitReady waits for its timeout.
func Exited(*exec.Cmd) bool { return false }

// Alive: without a portable check every directory is taken as in use, and
// Sweep removes none.
func Alive(int) bool { return true }
