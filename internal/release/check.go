package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// A checker publishes the tree at a candidate version into a file proxy and
// then uses it as a user outside the repository would: each step in empty
// modules, without the go.work, with a module cache of its own.
type checker struct {
	root    string // the repository
	mods    []mod
	version string
	// coreGo is the toolchain (GOTOOLCHAIN) that builds the consumer of the
	// core module; "local" for the go command's own.
	coreGo string
	out    io.Writer // progress, a line a step
	work   string    // scratch directory
	proxy  proxy
	env    []string // the go command's environment for every step
}

// consumerPath is the module path of the empty modules the check creates.
const consumerPath = "example.com/consumer"

// coreProgram is a service on the core module alone: net/http, the
// middleware, the memory store.
const coreProgram = `package main

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

// setup publishes every released module at c.version and sets the
// environment the steps share. The go command reads modules from the file
// proxy first, then from this machine's module cache (as a proxy: nothing
// it holds is trusted as the candidate), then from the usual proxy; its
// module cache is a new one, so that no earlier candidate of the same
// version is reused.
func (c *checker) setup() error {
	c.proxy = proxy{dir: filepath.Join(c.work, "proxy")}
	for _, m := range c.mods {
		if !m.Released {
			continue
		}
		if err := c.proxy.publish(c.root, m, c.version); err != nil {
			return fmt.Errorf("publishing %s: %w", m.Path, err)
		}
	}
	goproxy, err := goEnv("GOPROXY")
	if err != nil {
		return err
	}
	cache, err := goEnv("GOMODCACHE")
	if err != nil {
		return err
	}
	proxies := []string{c.proxy.URL()}
	if _, err := os.Stat(filepath.Join(cache, "cache", "download")); err == nil {
		proxies = append(proxies, "file://"+filepath.ToSlash(filepath.Join(cache, "cache", "download")))
	}
	if goproxy != "" && goproxy != "off" {
		proxies = append(proxies, goproxy)
	}
	c.env = append(os.Environ(),
		"GOWORK=off",
		"GOFLAGS=-mod=mod -modcacherw -trimpath",
		"GONOSUMDB="+repoPath,
		"GOPRIVATE=",
		"GONOPROXY=",
		"GOTOOLCHAIN=local",
		"GOMODCACHE="+filepath.Join(c.work, "modcache"),
		"GOPROXY="+strings.Join(proxies, ","),
	)
	return nil
}

// run is every step of the check; it stops at the first that fails.
func (c *checker) run(ctx context.Context) error {
	fmt.Fprintf(c.out, "publishing %d modules at %s into a file proxy\n", countReleased(c.mods), c.version)
	if err := c.setup(); err != nil {
		return err
	}
	for _, m := range c.mods {
		if !m.Released {
			continue
		}
		var err error
		if m.Binary {
			err = c.install(ctx, m)
		} else {
			err = c.get(ctx, m)
		}
		if err != nil {
			return err
		}
	}
	return c.core(ctx)
}

// get adds the library module m alone to an empty module and builds its
// packages.
func (c *checker) get(ctx context.Context, m mod) error {
	fmt.Fprintf(c.out, "go get %s@%s, alone, and build its packages; then go mod tidy a program that imports them\n", m.Path, c.version)
	dir, err := c.consumer(m.Path, "")
	if err != nil {
		return err
	}
	if _, err := c.goCmd(ctx, dir, nil, "get", m.Path+"@"+c.version); err != nil {
		return err
	}
	if err := c.requiresAt(ctx, dir, m); err != nil {
		return err
	}
	if _, err := c.goCmd(ctx, dir, nil, "build", m.Path+"/..."); err != nil {
		return err
	}
	// Then as a program that imports every package of the module's API:
	// go mod tidy also resolves what the tests of those packages import.
	out, err := c.goCmd(ctx, dir, nil, "list", "-f", "{{if ne .Name \"main\"}}{{.ImportPath}}{{end}}", m.Path+"/...")
	if err != nil {
		return err
	}
	src := "package main\n\nimport (\n"
	for _, pkg := range strings.Fields(out) {
		if !slices.Contains(strings.Split(strings.TrimPrefix(pkg, m.Path), "/"), "internal") {
			src += "\t_ \"" + pkg + "\"\n"
		}
	}
	src += ")\n\nfunc main() {}\n"
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
		return err
	}
	if _, err := c.goCmd(ctx, dir, nil, "mod", "tidy"); err != nil {
		return err
	}
	if err := c.requiresAt(ctx, dir, m); err != nil {
		return err
	}
	_, err = c.goCmd(ctx, dir, nil, "build", "-o", filepath.Join(dir, "program"), ".")
	return err
}

// requiresAt checks that the build list of the consumer in dir has every
// module of the repository at the candidate version.
func (c *checker) requiresAt(ctx context.Context, dir string, m mod) error {
	out, err := c.goCmd(ctx, dir, nil, "list", "-m", "-f", "{{.Path}} {{.Version}}", "all")
	if err != nil {
		return err
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		path, version, _ := strings.Cut(line, " ")
		if (path == repoPath || strings.HasPrefix(path, repoPath+"/")) && version != c.version {
			return fmt.Errorf("go get %s@%s selects %s %s, not %s", m.Path, c.version, path, version, c.version)
		}
	}
	return nil
}

// install installs the command m at the candidate version, as
// `go install PATH@VERSION` does outside any module, and runs it with
// -version, which must print that version.
func (c *checker) install(ctx context.Context, m mod) error {
	fmt.Fprintf(c.out, "go install %s@%s, then %s -version\n", m.Path, c.version, filepath.Base(m.Path))
	bin := filepath.Join(c.work, "bin")
	dir := filepath.Join(c.work, "outside")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if _, err := c.goCmd(ctx, dir, []string{"GOBIN=" + bin}, "install", m.Path+"@"+c.version); err != nil {
		return err
	}
	exe := filepath.Join(bin, filepath.Base(m.Path))
	cmd := exec.CommandContext(ctx, exe, "-version")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s -version: %v\n%s", exe, err, out)
	}
	fields := strings.Fields(string(out))
	if len(fields) < 2 || fields[0] != filepath.Base(m.Path) || fields[1] != c.version {
		return fmt.Errorf("%s -version printed %q; want %q first", exe, strings.TrimSpace(string(out)), filepath.Base(m.Path)+" "+c.version)
	}
	fmt.Fprintf(c.out, "  %s", out)
	return nil
}

// core builds a service on the core module alone in a module whose go
// directive is the core's (Go 1.25), with the toolchain c.coreGo, and
// checks that its go.sum holds no module but the core.
func (c *checker) core(ctx context.Context) error {
	var core mod
	for _, m := range c.mods {
		if m.Dir == "." {
			core = m
		}
	}
	goVersion := strings.Join(strings.SplitN(core.Go, ".", 3)[:2], ".")
	fmt.Fprintf(c.out, "a service on the core module alone (go %s in its go.mod, GOTOOLCHAIN=%s): build, and no third-party module in its go.sum\n", goVersion, c.coreGo)
	dir, err := c.consumer("core", goVersion)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(coreProgram), 0o644); err != nil {
		return err
	}
	env := []string{"GOTOOLCHAIN=" + c.coreGo}
	if _, err := c.goCmd(ctx, dir, env, "get", repoPath+"@"+c.version); err != nil {
		return err
	}
	if _, err := c.goCmd(ctx, dir, env, "mod", "tidy"); err != nil {
		return err
	}
	out, err := c.goCmd(ctx, dir, env, "version")
	if err != nil {
		return err
	}
	fmt.Fprintf(c.out, "  built with %s", out)
	if _, err := c.goCmd(ctx, dir, env, "build", "-o", filepath.Join(dir, "service"), "."); err != nil {
		return err
	}
	sum, err := os.ReadFile(filepath.Join(dir, "go.sum"))
	if err != nil {
		return err
	}
	var others []string
	for _, line := range strings.Split(strings.TrimSpace(string(sum)), "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] != repoPath {
			others = append(others, line)
		}
	}
	if len(others) > 0 {
		return fmt.Errorf("the go.sum of a service on the core module holds other modules:\n%s", strings.Join(others, "\n"))
	}
	return nil
}

// consumer creates an empty module named for what it consumes, with a go
// directive when goVersion is not "".
func (c *checker) consumer(name, goVersion string) (string, error) {
	dir := filepath.Join(c.work, "consumers", strings.ReplaceAll(name, "/", "_"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	gomod := "module " + consumerPath + "\n"
	if goVersion != "" {
		gomod += "\ngo " + goVersion + "\n"
	}
	return dir, os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod), 0o644)
}

// goCmd runs the go command in dir with the check's environment and env
// over it, and returns its standard output. Its error holds the command,
// where it ran, and everything it printed.
func (c *checker) goCmd(ctx context.Context, dir string, env []string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = append(append([]string(nil), c.env...), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", &stepError{cmd: "go " + strings.Join(args, " "), dir: dir, env: env, err: err, output: stdout.String() + stderr.String()}
	}
	return stdout.String(), nil
}

// A stepError is a step of the check that failed.
type stepError struct {
	cmd, dir string
	env      []string
	err      error
	output   string
}

func (e *stepError) Error() string {
	env := ""
	if len(e.env) > 0 {
		env = strings.Join(e.env, " ") + " "
	}
	return fmt.Sprintf("%s%s (in %s): %v\n%s", env, e.cmd, e.dir, e.err, strings.TrimRight(e.output, "\n"))
}

func (e *stepError) Unwrap() error { return e.err }

// goEnv is the go command's value of the variable name.
func goEnv(name string) (string, error) {
	out, err := exec.Command("go", "env", name).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return "", fmt.Errorf("go env %s: %v\n%s", name, err, ee.Stderr)
		}
		return "", fmt.Errorf("go env %s: %v", name, err)
	}
	return strings.TrimSpace(string(out)), nil
}

func countReleased(mods []mod) int {
	n := 0
	for _, m := range mods {
		if m.Released {
			n++
		}
	}
	return n
}

// compatible compares the exported API of every library module with the
// release before the candidate in CHANGELOG.md, and fails on an
// incompatible change that the candidate's section does not name (see
// unlistedChanges). A module that the earlier release did not have is
// new: nothing to compare.
func (c *checker) compatible(ctx context.Context) error {
	data, err := os.ReadFile(filepath.Join(c.root, "CHANGELOG.md"))
	if err != nil {
		return err
	}
	log, err := parseChangelog(string(data))
	if err != nil {
		return err
	}
	text, ok := log.section(c.version)
	if !ok {
		return fmt.Errorf("CHANGELOG.md has no section \"## [%s] - YYYY-MM-DD\": say what %s changes", strings.TrimPrefix(c.version, "v"), c.version)
	}
	prev := log.previous(c.version)
	if prev == "" {
		fmt.Fprintf(c.out, "API: CHANGELOG.md lists no release before %s: nothing to compare\n", c.version)
		return nil
	}
	var unlisted []string
	for _, m := range c.mods {
		if !m.Released || m.Binary {
			continue
		}
		if err := os.MkdirAll(filepath.Join(c.work, "outside"), 0o755); err != nil {
			return err
		}
		if _, err := c.goCmd(ctx, filepath.Join(c.work, "outside"), nil, "list", "-m", m.Path+"@"+prev); err != nil {
			fmt.Fprintf(c.out, "API: %s has no release %s: a new module, nothing to compare\n", m.Path, prev)
			continue
		}
		fmt.Fprintf(c.out, "API: %s %s against %s\n", m.Path, c.version, prev)
		report, err := apiChanges(ctx, c.env, filepath.Join(c.work, "api"), m.Path, prev, c.version)
		if err != nil {
			return err
		}
		unlisted = append(unlisted, unlistedChanges(report, m.Path, text)...)
	}
	if len(unlisted) > 0 {
		return fmt.Errorf("incompatible changes since %s that CHANGELOG.md's section for %s does not name:\n\t%s",
			prev, c.version, strings.Join(unlisted, "\n\t"))
	}
	return nil
}
