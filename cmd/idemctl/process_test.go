package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestBinary builds idemctl with go build and runs it as a process: main
// hands the arguments, the environment, standard input and output to run,
// and exits with its status.
func TestBinary(t *testing.T) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Fatal("no go command on PATH")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin := filepath.Join(t.TempDir(), "idemctl")
	if out, err := exec.CommandContext(ctx, goCmd, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	store, flags := openRedis(t)
	addr, prefix := flags[1], flags[3]
	s := newShop(t, store)
	s.order("order-1")
	key := skey("order-1")
	var env []string // without the variables that name a store
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if name != envRedisAddr && name != envRedisCluster && name != envPGDSN && name != envMySQLDSN && name != envDynamoDB {
			env = append(env, kv)
		}
	}

	for _, c := range []struct {
		name           string
		env            []string
		stdin          string
		args           []string
		code           int
		stdout, stderr string
	}{
		{name: "no command", code: exitUsage, stderr: "no command"},
		{name: "help", args: []string{"-h"}, stdout: "Exit status"},
		{name: "inspect", args: append(flags, "inspect", key), stdout: "201"},
		{name: "the environment", env: []string{envRedisAddr + "=" + addr}, args: []string{"-prefix", prefix, "-json", "ls"}, stdout: key},
		{name: "no such entry", args: append(flags, "inspect", skey("order-2")), code: exitNotFound, stderr: "no such entry"},
		{name: "rm not confirmed", stdin: "n\n", args: append(flags, "rm", key), code: exitNotConfirmed, stderr: "remove it? [y/N]"},
		{name: "rm confirmed", stdin: "y\n", args: append(flags, "rm", key), stdout: "removed"},
		{name: "unreachable", args: []string{"-redis", closedAddr(t), "stats"}, code: exitFailed, stderr: "refused"},
	} {
		cmd := exec.CommandContext(ctx, bin, c.args...)
		cmd.Env = append(env[:len(env):len(env)], c.env...)
		cmd.Stdin = strings.NewReader(c.stdin)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		code := 0
		if err := cmd.Run(); err != nil {
			var exit *exec.ExitError
			if !errors.As(err, &exit) {
				t.Fatalf("%s: %v", c.name, err)
			}
			code = exit.ExitCode()
		}
		if code != c.code || !strings.Contains(stdout.String(), c.stdout) || !strings.Contains(stderr.String(), c.stderr) {
			t.Errorf("%s: idemctl %q: exit status %d, want %d; stdout (want %q):\n%s\nstderr (want %q):\n%s",
				c.name, c.args, code, c.code, c.stdout, &stdout, c.stderr, &stderr)
		}
	}
}
