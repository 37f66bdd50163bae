package dynamotest

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestWithoutDynalite runs this test binary again, as a helper that finds
// no dynalite, or a dynalite without node, or one that does not start:
// Endpoint skips the test with a message saying why and how to install
// dynalite, and fails it instead under IDEM_REQUIRE_DYNAMODB=1; an
// IDEM_DYNALITE that names nothing, and a dynalite that exits, fail it
// either way.
func TestWithoutDynalite(t *testing.T) {
	dir := t.TempDir()
	script := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	noNode := script("node-script", "#!/usr/bin/env node\n")
	exits := script("exits", "#!/bin/sh\necho dynalite-would-not-start >&2\nexit 3\n")
	const install = "npm install --prefix ~/.cache/idem-dynalite dynalite@4.0.0"
	for _, c := range []struct {
		dynalite, require string
		unix              bool // a case with a script, on Linux only (elsewhere WaitReady waits out its timeout)
		want              []string
	}{
		{"", "", false, []string{"--- SKIP: TestHelperWithoutDynalite", "dynalite is not installed", install}},
		{"", "1", false, []string{"--- FAIL: TestHelperWithoutDynalite", "dynalite is not installed", install, EnvRequire + "=1"}},
		{noNode, "", true, []string{"--- SKIP: TestHelperWithoutDynalite", noNode + " is a script of node's, and node is not on PATH"}},
		{noNode, "1", true, []string{"--- FAIL: TestHelperWithoutDynalite", "node is not on PATH"}},
		{filepath.Join(dir, "nothing"), "", false, []string{"--- FAIL: TestHelperWithoutDynalite", EnvDynalite + "=" + filepath.Join(dir, "nothing")}},
		{exits, "", true, []string{"--- FAIL: TestHelperWithoutDynalite", "exited", "dynalite-would-not-start"}},
	} {
		if c.unix && runtime.GOOS != "linux" {
			continue
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperWithoutDynalite$", "-test.count=1", "-test.v")
		// No HOME (so no ~/.cache/idem-dynalite) and an empty PATH.
		cmd.Env = []string{"DYNAMOTEST_HELPER=none", EnvRequire + "=" + c.require, EnvDynalite + "=" + c.dynalite, "PATH="}
		out, err := cmd.CombinedOutput()
		wantErr := strings.HasPrefix(c.want[0], "--- FAIL")
		if (err != nil) != wantErr || !containsAll(string(out), c.want) {
			t.Errorf("%s=%s %s=%s: %v, want %q; output:\n%s", EnvDynalite, c.dynalite, EnvRequire, c.require, err, c.want, out)
		}
	}
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// TestHelperWithoutDynalite is the helper of TestWithoutDynalite.
func TestHelperWithoutDynalite(t *testing.T) {
	if os.Getenv("DYNAMOTEST_HELPER") != "none" {
		t.Skip("a helper of TestWithoutDynalite")
	}
	Endpoint(t)
	t.Error("Endpoint returned without a server")
}
