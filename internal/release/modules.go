package main

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
)

// repoPath is the core module's path; every module of the repository is
// this path or below it.
const repoPath = "github.com/idemkit/idem"

// A mod is a module of the repository, as go.work lists it.
type mod struct {
	Dir  string // slash-separated, relative to the root; "." for the core
	Path string // module path
	Go   string // its go directive
	// Released: the module is tagged and published. A module under an
	// internal directory, or the examples, is not: it exists for the
	// repository's own tests and demos.
	Released bool
	// Binary: the module's root package is a command, installed with
	// `go install PATH@VERSION`.
	Binary bool
	// Siblings are the requirements on other modules of the repository.
	Siblings []modfile.Require
	// Replaces are the module's replace directives: a published module
	// must have none.
	Replaces []*modfile.Replace
}

// Tag is the git tag that releases the module at version: the version
// prefixed with the module's directory, as the go command looks it up.
func (m mod) Tag(version string) string {
	if m.Dir == "." {
		return version
	}
	return m.Dir + "/" + version
}

// loadModules reads go.work at root and the go.mod of each module it uses.
func loadModules(root string) ([]mod, error) {
	data, err := os.ReadFile(filepath.Join(root, "go.work"))
	if err != nil {
		return nil, err
	}
	work, err := modfile.ParseWork("go.work", data, nil)
	if err != nil {
		return nil, err
	}
	var mods []mod
	for _, use := range work.Use {
		dir := path.Clean(filepath.ToSlash(use.Path))
		gomod := filepath.Join(root, filepath.FromSlash(dir), "go.mod")
		data, err := os.ReadFile(gomod)
		if err != nil {
			return nil, err
		}
		f, err := modfile.Parse(gomod, data, nil)
		if err != nil {
			return nil, err
		}
		m := mod{Dir: dir, Path: f.Module.Mod.Path, Replaces: f.Replace}
		if f.Go != nil {
			m.Go = f.Go.Version
		}
		want := repoPath
		if dir != "." {
			want += "/" + dir
		}
		if m.Path != want {
			return nil, fmt.Errorf("%s: module %s, want %s (the path of its directory)", gomod, m.Path, want)
		}
		elems := strings.Split(dir, "/")
		m.Released = !slices.Contains(elems, "internal") && elems[0] != "examples"
		m.Binary, err = isCommand(filepath.Dir(gomod))
		if err != nil {
			return nil, err
		}
		for _, r := range f.Require {
			if r.Mod.Path == repoPath || strings.HasPrefix(r.Mod.Path, repoPath+"/") {
				m.Siblings = append(m.Siblings, *r)
			}
		}
		mods = append(mods, m)
	}
	slices.SortFunc(mods, func(a, b mod) int { return strings.Compare(a.Path, b.Path) })
	return mods, nil
}

// isCommand reports whether the Go files of dir (its tests aside) are
// package main.
func isCommand(dir string) (bool, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return false, err
	}
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		data, err := os.ReadFile(name)
		if err != nil {
			return false, err
		}
		return packageClause(data) == "main", nil
	}
	return false, nil
}

// packageClause is the name in the first package clause of Go source.
func packageClause(src []byte) string {
	for _, line := range strings.Split(string(src), "\n") {
		if name, ok := strings.CutPrefix(strings.TrimSpace(line), "package "); ok {
			return strings.TrimSpace(strings.SplitN(name, "//", 2)[0])
		}
	}
	return ""
}

// requiredVersion is the one version at which the modules require each
// other, the version the tree is prepared to release. It is an error if
// two requirements name different versions, if a version is not a
// canonical release version (no pseudo-version, no +incompatible), or if a
// module has a replace directive.
func requiredVersion(mods []mod) (string, error) {
	var errs []error
	version := ""
	for _, m := range mods {
		for _, r := range m.Replaces {
			errs = append(errs, fmt.Errorf("%s/go.mod: replace %s: a published module must have no replace directive (go.work ties the modules for development)", m.Dir, r.Old.Path))
		}
		for _, r := range m.Siblings {
			v := r.Mod.Version
			switch {
			case !semver.IsValid(v) || semver.Canonical(v) != v || semver.Build(v) != "":
				errs = append(errs, fmt.Errorf("%s/go.mod: require %s %s: not a release version", m.Dir, r.Mod.Path, v))
			case module.IsPseudoVersion(v):
				errs = append(errs, fmt.Errorf("%s/go.mod: require %s %s: a pseudo-version, which no tag can give", m.Dir, r.Mod.Path, v))
			case version == "":
				version = v
			case v != version:
				errs = append(errs, fmt.Errorf("%s/go.mod: require %s %s: the modules are released together, and others require %s", m.Dir, r.Mod.Path, v, version))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return "", err
	}
	if version == "" {
		return "", errors.New("no module requires another: nothing says which version is being prepared")
	}
	return version, nil
}
