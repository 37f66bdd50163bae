package mysqltest

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestWithoutMariaDB runs this test binary again, as a helper that finds
// no server binaries: DSN skips the test with a message saying so, and
// fails it instead under IDEM_REQUIRE_MYSQL=1.
func TestWithoutMariaDB(t *testing.T) {
	for _, c := range []struct {
		require string
		wantErr bool
		want    string
	}{
		{"", false, "--- SKIP: TestHelperWithoutMariaDB"},
		{"1", true, "--- FAIL: TestHelperWithoutMariaDB"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperWithoutMariaDB$", "-test.count=1", "-test.v")
		cmd.Env = []string{"MYSQLTEST_HELPER=none", EnvRequire + "=" + c.require, "PATH=" + os.Getenv("PATH")}
		out, err := cmd.CombinedOutput()
		if (err != nil) != c.wantErr || !strings.Contains(string(out), c.want) ||
			!strings.Contains(string(out), "no MariaDB server binaries (mariadb-install-db, mariadbd) found") {
			t.Errorf("%s=%s: %v, want %s with the reason; output:\n%s", EnvRequire, c.require, err, c.want, out)
		}
	}
}

// TestHelperWithoutMariaDB is the helper of TestWithoutMariaDB.
func TestHelperWithoutMariaDB(t *testing.T) {
	if os.Getenv("MYSQLTEST_HELPER") != "none" {
		t.Skip("a helper of TestWithoutMariaDB")
	}
	binDirs = nil
	os.Setenv("PATH", "")
	DSN(t)
	t.Error("DSN returned without a server")
}

// TestWithDatabase checks the DSN rewriting.
func TestWithDatabase(t *testing.T) {
	for in, want := range map[string]string{
		"root@tcp(127.0.0.1:3306)/?parseTime=true": "root@tcp(127.0.0.1:3306)/db?parseTime=true",
		"u:p@tcp(h:1)/":            "u:p@tcp(h:1)/db",
		"u:p@tcp(h:1)/old?x=1&y=2": "u:p@tcp(h:1)/db?x=1&y=2",
	} {
		if got := WithDatabase(in, "db"); got != want {
			t.Errorf("WithDatabase(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestServerStarts starts the shared server (or uses IDEM_MYSQL_DSN) and
// checks that it answers with a greeting.
func TestServerStarts(t *testing.T) {
	dsn := DSN(t)
	if os.Getenv(EnvDSN) != "" {
		t.Skip("the server of " + EnvDSN + " is not mysqltest's")
	}
	if !strings.HasPrefix(dsn, "root@tcp(127.0.0.1:") {
		t.Fatalf("DSN %q", dsn)
	}
	shared.mu.Lock()
	dir := shared.srv.dir
	shared.mu.Unlock()
	if _, err := os.Stat(dir); err != nil {
		t.Fatal(err)
	}
}
