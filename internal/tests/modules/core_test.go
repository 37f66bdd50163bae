// Package modules checks the promise of the module split: a program that
// uses only the core module (the root package, nethttp, memstore) takes in
// no third-party module at all.
package modules

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const program = `package main

import (
	"net/http"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage/memstore"
)

func main() {
	m, err := idem.New(memstore.New())
	if err != nil {
		panic(err)
	}
	http.Handle("POST /orders", nethttp.Middleware(m)(http.NotFoundHandler()))
}
`

// TestCoreProgramTakesNoThirdPartyModule builds, outside the go.work, a
// program that requires the core module (replaced by this checkout) and
// imports the root package, nethttp and memstore:
//   - `go mod tidy` with an empty module cache, fed by a proxy that serves
//     this machine's cache, downloads nothing and writes an empty go.sum
//     (tidy fetches what the tests of every imported package need, so this
//     also proves that the core's tests require no third-party module);
//   - `go list -deps` finds no package outside the standard library, the
//     program and the core;
//   - `go build` succeeds, with the toolchain IDEM_CORE_TOOLCHAIN names
//     (CI sets the oldest Go the core supports; the local one otherwise).
func TestCoreProgramTakesNoThirdPartyModule(t *testing.T) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Fatal("no go command on PATH")
	}
	core, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	cache := strings.TrimSpace(run(t, goCmd, "", nil, "env", "GOMODCACHE"))
	dir := t.TempDir()
	write(t, filepath.Join(dir, "go.mod"), "module example.com/app\n\ngo 1.25.0\n\n"+
		"require github.com/idemkit/idem v0.0.0\n\nreplace github.com/idemkit/idem => "+filepath.ToSlash(core)+"\n")
	write(t, filepath.Join(dir, "main.go"), program)

	fresh := t.TempDir()
	run(t, goCmd, dir, []string{
		"GOMODCACHE=" + fresh, "GOFLAGS=-modcacherw", "GOSUMDB=off", "GOTOOLCHAIN=local",
		"GOPROXY=file://" + filepath.ToSlash(filepath.Join(cache, "cache", "download")),
	}, "mod", "tidy")
	var fetched []string
	filepath.WalkDir(filepath.Join(fresh, "cache", "download"), func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			fetched = append(fetched, strings.TrimPrefix(path, fresh+string(filepath.Separator)))
		}
		return nil
	})
	if len(fetched) > 0 {
		t.Errorf("go mod tidy downloaded:\n%s", strings.Join(fetched, "\n"))
	}
	if sum, err := os.ReadFile(filepath.Join(dir, "go.sum")); err == nil && len(sum) > 0 {
		t.Errorf("go.sum after tidy:\n%s", sum)
	}

	offline := []string{"GOPROXY=off", "GOFLAGS=-mod=readonly", "GOTOOLCHAIN=local"}
	for _, pkg := range strings.Fields(run(t, goCmd, dir, offline, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".")) {
		if pkg != "example.com/app" && pkg != "github.com/idemkit/idem" && !strings.HasPrefix(pkg, "github.com/idemkit/idem/") {
			t.Errorf("the program compiles %s", pkg)
		}
	}

	toolchain := os.Getenv("IDEM_CORE_TOOLCHAIN")
	if toolchain == "" {
		toolchain = "local"
	}
	build := []string{"GOPROXY=off", "GOFLAGS=-mod=readonly", "GOTOOLCHAIN=" + toolchain}
	t.Logf("built with %s", strings.TrimSpace(run(t, goCmd, dir, build, "version")))
	run(t, goCmd, dir, build, "build", "-o", filepath.Join(t.TempDir(), "app"), ".")
}

// run runs the go command in dir, outside any go.work, with env added, and
// returns its standard output; it fails the test if the command fails.
func run(t *testing.T, goCmd, dir string, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command(goCmd, args...)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), "GOWORK=off"), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}

func write(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}
