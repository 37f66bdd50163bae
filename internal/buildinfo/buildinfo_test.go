package buildinfo

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestVersion(t *testing.T) {
	if got := Version("v1.2.3"); got != "v1.2.3" {
		t.Errorf("Version(linked) = %q, want the linked version", got)
	}
	for _, tc := range []struct {
		name string
		info debug.BuildInfo
		want string
	}{
		{"go install PATH@VERSION", debug.BuildInfo{Main: debug.Module{Version: "v0.1.0"}}, "v0.1.0"},
		{"work tree", debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "(devel)"},
		{"work tree with a commit", debug.BuildInfo{
			Main:     debug.Module{Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.modified", Value: "false"}},
		}, "(devel) 0123456789ab"},
		{"work tree with changes", debug.BuildInfo{
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc"}, {Key: "vcs.modified", Value: "true"}},
		}, "(devel) abc+dirty"},
	} {
		if got := fromBuildInfo(&tc.info); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestLine(t *testing.T) {
	got := Line("idemctl", "v0.1.0")
	want := "idemctl v0.1.0 " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH
	if got != want {
		t.Errorf("Line = %q, want %q", got, want)
	}
	if !strings.HasPrefix(Line("x", ""), "x ") {
		t.Errorf("Line without a linked version: %q", Line("x", ""))
	}
}
