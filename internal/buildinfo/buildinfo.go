// Package buildinfo says which version of a command of this repository is
// running, for its -version flag.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version is the version of the running binary:
//   - linked, when the build set it (GoReleaser and the Dockerfile pass
//     -ldflags "-X main.version=v1.2.3");
//   - else the main module's version from the binary's build information,
//     which `go install PATH@v1.2.3` records as "v1.2.3";
//   - else "(devel)", a build from a work tree, with the commit it was built
//     from when the go command recorded one.
func Version(linked string) string {
	if linked != "" {
		return linked
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "(unknown)"
	}
	return fromBuildInfo(info)
}

func fromBuildInfo(info *debug.BuildInfo) string {
	v := info.Main.Version
	if v != "" && v != "(devel)" {
		return v
	}
	v = "(devel)"
	var rev, modified string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev != "" {
		v += " " + rev
		if modified == "true" {
			v += "+dirty"
		}
	}
	return v
}

// Line is what -version prints: the command's name, its version (see
// [Version]), the Go release that built it, and the platform.
func Line(name, linked string) string {
	return fmt.Sprintf("%s %s %s %s/%s", name, Version(linked), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
