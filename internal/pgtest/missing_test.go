package pgtest

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestWithoutPostgreSQL runs this test binary again, as a helper that
// finds no PostgreSQL: DSN skips the test with a message saying so, and
// fails it instead under IDEM_REQUIRE_PG=1.
func TestWithoutPostgreSQL(t *testing.T) {
	for _, c := range []struct {
		require string
		wantErr bool
		want    string
	}{
		{"", false, "--- SKIP: TestHelperWithoutPostgreSQL"},
		{"1", true, "--- FAIL: TestHelperWithoutPostgreSQL"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperWithoutPostgreSQL$", "-test.count=1", "-test.v")
		cmd.Env = []string{"PGTEST_HELPER=nopg", EnvRequire + "=" + c.require, "PATH=" + os.Getenv("PATH")}
		out, err := cmd.CombinedOutput()
		if (err != nil) != c.wantErr || !strings.Contains(string(out), c.want) ||
			!strings.Contains(string(out), "no PostgreSQL server binaries (initdb, postgres) found") {
			t.Errorf("%s=%s: %v, want %s with the reason; output:\n%s", EnvRequire, c.require, err, c.want, out)
		}
	}
}

// TestHelperWithoutPostgreSQL is the helper of TestWithoutPostgreSQL.
func TestHelperWithoutPostgreSQL(t *testing.T) {
	if os.Getenv("PGTEST_HELPER") != "nopg" {
		t.Skip("a helper of TestWithoutPostgreSQL")
	}
	debianBins = "/nonexistent/*/bin"
	os.Setenv("PATH", "")
	DSN(t)
	t.Error("DSN returned without PostgreSQL")
}
