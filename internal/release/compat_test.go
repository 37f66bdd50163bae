package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/exp/apidiff"
	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

// TestCompatModule compares real releases of the core module, made from
// the work tree into a file proxy: v0.1.0, v0.1.1 (the same files) and
// v0.2.0 (v0.1.0 with its API broken on purpose).
func TestCompatModule(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the go command on modules of a file proxy")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	p := proxy{dir: t.TempDir()}
	core := mod{Dir: ".", Path: repoPath}
	for _, v := range []string{"v0.1.0", "v0.1.1"} {
		if err := p.publish(root, core, v); err != nil {
			t.Fatal(err)
		}
	}

	// v0.2.0: WithLease removed, Middleware.InFlight's result changed from
	// int to int64, AddedInV020 added.
	republish(t, p, "v0.1.0", "v0.2.0", func(dir string) {
		edit(t, filepath.Join(dir, "options.go"),
			"func WithLease(d time.Duration) Option {",
			"func withLease(d time.Duration) Option {")
		edit(t, filepath.Join(dir, "shutdown.go"),
			"func (m *Middleware) InFlight() int { return m.work.count() }",
			"func (m *Middleware) InFlight() int64 { return int64(m.work.count()) }")
		write(t, filepath.Join(dir, "added.go"), "package idem\n\n// AddedInV020 is new in v0.2.0.\nfunc AddedInV020() {}\n")
	})
	// v0.2.1: a type error in the root package.
	republish(t, p, "v0.1.0", "v0.2.1", func(dir string) {
		write(t, filepath.Join(dir, "bad.go"), "package idem\n\n// Bad does not compile.\nvar Bad int = \"bad\"\n")
	})

	env := compatEnv(t, p)
	work := t.TempDir()

	t.Run("unchanged", func(t *testing.T) {
		t.Parallel()
		r, err := apiChanges(t.Context(), env, work, repoPath, "v0.1.0", "v0.1.1")
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Changes) != 0 {
			t.Errorf("v0.1.0 to v0.1.1, the same files: got changes\n%s", r)
		}
		if got := unlistedChanges(r, repoPath, ""); len(got) != 0 {
			t.Errorf("unlistedChanges = %q, want none", got)
		}
	})

	t.Run("broken", func(t *testing.T) {
		t.Parallel()
		r, err := apiChanges(t.Context(), env, work, repoPath, "v0.1.0", "v0.2.0")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("v0.1.0 to v0.2.0:\n%s", r)
		want := apidiff.Report{Changes: []apidiff.Change{
			{Message: "(*Middleware).InFlight: changed from func() int to func() int64"},
			{Message: "WithLease: removed"},
			{Message: "AddedInV020: added", Compatible: true},
		}}
		if !slices.Equal(r.Changes, want.Changes) {
			t.Errorf("got changes\n%s\nwant\n%s", r, want)
		}

		inflight := "`idem.Middleware.InFlight`: changed from func() int to func() int64 (in package github.com/idemkit/idem)"
		lease := "`idem.WithLease`: removed (in package github.com/idemkit/idem)"
		for _, tc := range []struct {
			section string
			want    []string
		}{
			{"", []string{inflight, lease}},
			{"### Added\n\n- `idem.AddedInV020`.\n", []string{inflight, lease}},
			{"### Removed\n\n- `idem.WithLease`: leases are fixed now.\n", []string{inflight}},
			{"### Changed\n\n- `idem.Middleware.InFlight` returns an int64.\n", []string{lease}},
			{"- `idem.WithLease` is gone.\n- `idem.Middleware.InFlight` returns an int64.\n", nil},
			// The name must be written whole, as the rule says.
			{"- `WithLease`, `(*Middleware).InFlight`, idem.WithLease\n", []string{inflight, lease}},
		} {
			if got := unlistedChanges(r, repoPath, tc.section); !slices.Equal(got, tc.want) {
				t.Errorf("unlistedChanges with section %q:\ngot  %q\nwant %q", tc.section, got, tc.want)
			}
		}
	})

	t.Run("typeerror", func(t *testing.T) {
		t.Parallel()
		_, err := apiChanges(t.Context(), env, work, repoPath, "v0.1.0", "v0.2.1")
		if err == nil || !strings.Contains(err.Error(), "bad.go") || !strings.Contains(err.Error(), `"bad"`) {
			t.Errorf("apiChanges with a version that does not compile: error %v, want the compiler's error", err)
		}
	})

	t.Run("missing", func(t *testing.T) {
		t.Parallel()
		_, err := apiChanges(t.Context(), env, work, repoPath, "v0.1.0", "v0.3.0")
		if err == nil || !strings.Contains(err.Error(), "go get") || !strings.Contains(err.Error(), "v0.3.0") {
			t.Errorf("apiChanges with a version the proxy lacks: error %v, want the go get error", err)
		}
	})
}

// TestCompatNames checks the name unlistedChanges gives each form of
// apidiff message.
func TestCompatNames(t *testing.T) {
	const m = "github.com/idemkit/idem"
	for _, tc := range []struct{ msg, name, line string }{
		{"WithLease: removed", "idem.WithLease",
			"`idem.WithLease`: removed (in package github.com/idemkit/idem)"},
		{"(*Middleware).InFlight: changed from func() int to func() int64", "idem.Middleware.InFlight",
			"`idem.Middleware.InFlight`: changed from func() int to func() int64 (in package github.com/idemkit/idem)"},
		{"Config.Lease: removed", "idem.Config.Lease",
			"`idem.Config.Lease`: removed (in package github.com/idemkit/idem)"},
		{"./nethttp.Middleware: changed from func(*github.com/idemkit/idem.Middleware) func(net/http.Handler) net/http.Handler to func()",
			"nethttp.Middleware",
			"`nethttp.Middleware`: changed from func(*github.com/idemkit/idem.Middleware) func(net/http.Handler) net/http.Handler to func() (in package github.com/idemkit/idem/nethttp)"},
		{"./storage/memstore.(*Store).Len: removed", "memstore.Store.Len",
			"`memstore.Store.Len`: removed (in package github.com/idemkit/idem/storage/memstore)"},
		{"./storage.Store.Acquire: removed", "storage.Store.Acquire",
			"`storage.Store.Acquire`: removed (in package github.com/idemkit/idem/storage)"},
		{"./storage.(*Cache[K, V]).Get: removed", "storage.Cache.Get",
			"`storage.Cache.Get`: removed (in package github.com/idemkit/idem/storage)"},
		{"Ch, element type: changed from int to bool", "idem.Ch",
			"`idem.Ch`, element type: changed from int to bool (in package github.com/idemkit/idem)"},
		{"(*embedded).M, method set of *Middleware: removed", "idem.embedded.M",
			"`idem.embedded.M`, method set of *Middleware: removed (in package github.com/idemkit/idem)"},
		{"package github.com/idemkit/idem/nethttp: removed", "github.com/idemkit/idem/nethttp",
			"`github.com/idemkit/idem/nethttp`: package removed"},
	} {
		name, line := changeLine(tc.msg, m)
		if name != tc.name || line != tc.line {
			t.Errorf("changeLine(%q):\ngot  %q, %q\nwant %q, %q", tc.msg, name, line, tc.name, tc.line)
		}
	}
	for path, want := range map[string]string{
		"github.com/idemkit/idem":                  "idem",
		"github.com/idemkit/idem/v2":               "idem",
		"github.com/idemkit/idem/v2/nethttp":       "nethttp",
		"github.com/idemkit/idem/storage/memstore": "memstore",
		"gopkg.in/yaml.v3":                         "yaml",
	} {
		if got := packageName(path); got != want {
			t.Errorf("packageName(%q) = %q, want %q", path, got, want)
		}
	}
}

// republish writes the module of proxy p at version from, changed by
// change (given the directory of its files), into p at version to.
func republish(t *testing.T, p proxy, from, to string, change func(dir string)) {
	t.Helper()
	dir := t.TempDir()
	esc, err := module.EscapePath(repoPath)
	if err != nil {
		t.Fatal(err)
	}
	zipFile := filepath.Join(p.dir, filepath.FromSlash(esc), "@v", from+".zip")
	if err := zip.Unzip(dir, module.Version{Path: repoPath, Version: from}, zipFile); err != nil {
		t.Fatal(err)
	}
	change(dir)
	publishDir(t, p, repoPath, to, dir)
}

// write creates file with the text content.
func write(t *testing.T, file, content string) {
	t.Helper()
	if err := os.WriteFile(file, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// edit replaces the one occurrence of from in file with to.
func edit(t *testing.T, file, from, to string) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(data, []byte(from)); n != 1 {
		t.Fatalf("%s: %d occurrences of %q, want 1", file, n, from)
	}
	// zip.Unzip makes its files read-only.
	if err := os.Chmod(file, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, bytes.Replace(data, []byte(from), []byte(to), 1), 0o644); err != nil {
		t.Fatal(err)
	}
}

// publishDir writes the module path in dir into proxy p at version, as
// proxy.publish writes one of the work tree.
func publishDir(t *testing.T, p proxy, path, version, dir string) {
	t.Helper()
	esc, err := module.EscapePath(path)
	if err != nil {
		t.Fatal(err)
	}
	at := filepath.Join(p.dir, filepath.FromSlash(esc), "@v")
	var buf bytes.Buffer
	if err := zip.CreateFromDir(&buf, module.Version{Path: path, Version: version}, dir); err != nil {
		t.Fatal(err)
	}
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	info := fmt.Sprintf(`{"Version":%q,"Time":%q}`, version, time.Now().UTC().Format(time.RFC3339))
	list, err := os.ReadFile(filepath.Join(at, "list"))
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{
		version + ".zip":  buf.Bytes(),
		version + ".mod":  gomod,
		version + ".info": []byte(info),
		"list":            append(list, version+"\n"...),
	} {
		if err := os.WriteFile(filepath.Join(at, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// compatEnv is the environment of the go command for apiChanges on proxy
// p. Its module cache is a scratch one, writable so that the test can
// remove it: modules of the same path and version would otherwise be
// taken from the shared cache, as they were published by an earlier run.
func compatEnv(t *testing.T, p proxy) []string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOPROXY").Output()
	if err != nil {
		t.Fatal(err)
	}
	return append(os.Environ(),
		"GOPROXY="+p.URL()+","+strings.TrimSpace(string(out)),
		"GONOSUMDB="+repoPath,
		"GOWORK=off",
		"GOFLAGS=-mod=mod -modcacherw",
		"GOMODCACHE="+t.TempDir(),
		"GOTOOLCHAIN=local",
	)
}
