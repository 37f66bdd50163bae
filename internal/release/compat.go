package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"slices"
	"strings"

	"golang.org/x/exp/apidiff"
	"golang.org/x/mod/module"
	"golang.org/x/tools/go/packages"
)

// apiChanges compares the exported API of module modPath at oldVersion
// with its API at newVersion, as golang.org/x/exp/apidiff.ModuleChanges
// does.
//
// Each version is fetched by the go command, run with env (the caller's
// whole environment: GOPROXY, GONOSUMDB, GOWORK=off, GOFLAGS=-mod=mod,
// GOTOOLCHAIN=local and so on), into a fresh, empty consumer module made
// under the scratch directory work, itself made if need be (go mod init,
// go get modPath@version). The packages modPath/... are listed there, and
// those of the API loaded with types, from the compiler's export data. Packages named main, and
// those whose import path has an "internal" element below modPath, are no
// part of the API and are left out (they are compiled only when an API
// package imports them); the packages of nested modules are not in
// modPath/... at all.
//
// The error of a failed go get, or of packages that do not load, holds the
// go command's or the packages' own error text.
func apiChanges(ctx context.Context, env []string, work, modPath, oldVersion, newVersion string) (apidiff.Report, error) {
	oldAPI, err := loadAPI(ctx, env, work, modPath, oldVersion)
	if err != nil {
		return apidiff.Report{}, err
	}
	newAPI, err := loadAPI(ctx, env, work, modPath, newVersion)
	if err != nil {
		return apidiff.Report{}, err
	}
	return apidiff.ModuleChanges(oldAPI, newAPI), nil
}

// loadAPI fetches module modPath at version into a new consumer module
// under work and loads the packages of its API, as apiChanges describes.
func loadAPI(ctx context.Context, env []string, work, modPath, version string) (*apidiff.Module, error) {
	if err := os.MkdirAll(work, 0o755); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(work, "api-"+strings.ReplaceAll(version, "/", "_")+"-")
	if err != nil {
		return nil, err
	}
	for _, args := range [][]string{{"mod", "init", "consumer"}, {"get", modPath + "@" + version}} {
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir = dir
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("%s@%s: go %s: %v\n%s", modPath, version, strings.Join(args, " "), err, out)
		}
	}
	// First the names, without compiling anything, then the types of the
	// packages that make the API (and of what they import).
	cfg := &packages.Config{Context: ctx, Mode: packages.NeedName, Env: env, Dir: dir}
	pkgs, err := packages.Load(cfg, modPath+"/...")
	if err != nil {
		return nil, fmt.Errorf("%s@%s: listing its packages: %w", modPath, version, err)
	}
	var paths []string
	for _, p := range pkgs {
		rel := strings.TrimPrefix(p.PkgPath, modPath)
		if p.Name != "main" && !slices.Contains(strings.Split(rel, "/"), "internal") {
			paths = append(paths, p.PkgPath)
		}
	}
	api := &apidiff.Module{Path: modPath}
	if len(paths) == 0 {
		return api, nil
	}
	cfg.Mode |= packages.NeedTypes
	pkgs, err = packages.Load(cfg, paths...)
	if err != nil {
		return nil, fmt.Errorf("%s@%s: loading its packages: %w", modPath, version, err)
	}
	var errs []error
	for _, p := range pkgs {
		for _, e := range p.Errors {
			errs = append(errs, fmt.Errorf("%s@%s: %s: %v", modPath, version, p.PkgPath, e))
		}
		api.Packages = append(api.Packages, p.Types)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return api, nil
}

// unlistedChanges returns, one line each, the incompatible changes of r
// (a report of apiChanges on module modPath) that the changelog section
// text does not name.
//
// A change is named when section holds its name in backquotes. The name
// of a change to a package-level object (func, type, var, const) is the
// package's name, a dot and the object's name; of a change to a method, a
// struct field or an interface method, the package's name, a dot, the
// type's name, a dot and the member's name. The package's name is the last
// element of its import path, less a major version suffix (/v2): the name
// by which Go code refers to it. A pointer receiver and type parameters
// are not written. For module github.com/idemkit/idem:
//
//	`idem.WithLease`            func WithLease of the root package
//	`idem.Middleware.InFlight`  method InFlight of *Middleware, in the root package
//	`nethttp.Middleware`        func Middleware of package ./nethttp
//	`memstore.Store.Len`        method Len of *Store, in ./storage/memstore
//	`storage.Lease.TTL`         field TTL of struct Lease, in ./storage
//	`storage.Store.Acquire`     method Acquire of interface Store, in ./storage
//
// A package removed as a whole is named by its import path:
// `github.com/idemkit/idem/nethttp`.
//
// Each line is apidiff's message with the object replaced by the name to
// write, followed by the package of the change, e.g.
//
//	`idem.WithLease`: removed (in package github.com/idemkit/idem)
//	`idem.Middleware.InFlight`: changed from func() int to func() int64 (in package github.com/idemkit/idem)
//	`github.com/idemkit/idem/nethttp`: package removed
//
// The lines follow the report's order, without repeats.
func unlistedChanges(r apidiff.Report, modPath, section string) []string {
	var lines []string
	for _, c := range r.Changes {
		if c.Compatible {
			continue
		}
		name, line := changeLine(c.Message, modPath)
		if strings.Contains(section, "`"+name+"`") || slices.Contains(lines, line) {
			continue
		}
		lines = append(lines, line)
	}
	return lines
}

// changeLine is the name a changelog gives the change of apidiff message
// msg, in module modPath, and the line unlistedChanges reports for it.
//
// apidiff writes a message as OBJECT[, DETAIL]: TEXT, where OBJECT is the
// object (F, T.M, (*T).M, G[K, V].M, S.F) prefixed by the package's path,
// "./sub/pkg." relative to the module or the whole path for a package
// outside it, and nothing for the module's root package; or as
// "package PATH: TEXT" for a package added or removed.
func changeLine(msg, modPath string) (name, line string) {
	head, text, _ := strings.Cut(msg, ": ")
	if pkg, ok := strings.CutPrefix(head, "package "); ok {
		return pkg, "`" + pkg + "`: package " + text
	}
	obj, detail := splitObject(head)
	pkgPath := modPath
	if slash := strings.LastIndex(obj, "/"); slash >= 0 {
		dot := slash + strings.Index(obj[slash:], ".")
		pkgPath, obj = obj[:dot], obj[dot+1:]
		if rel, ok := strings.CutPrefix(pkgPath, "./"); ok {
			pkgPath = modPath + "/" + rel
		}
	}
	obj = strings.NewReplacer("(*", "", ")", "").Replace(obj)
	name = packageName(pkgPath) + "." + obj
	return name, "`" + name + "`" + detail + ": " + text + " (in package " + pkgPath + ")"
}

// splitObject splits the object part of an apidiff message into the
// object, with its type arguments dropped, and the detail that follows it
// after a comma (", element type"), if any.
func splitObject(head string) (obj, detail string) {
	var b strings.Builder
	depth := 0
	for i, r := range head {
		switch {
		case r == '[':
			depth++
		case r == ']':
			depth--
		case depth == 0 && strings.HasPrefix(head[i:], ", "):
			return b.String(), head[i:]
		case depth == 0:
			b.WriteRune(r)
		}
	}
	return b.String(), ""
}

// packageName is the name Go code gives the package at importPath: its
// last element, less a major version suffix.
func packageName(importPath string) string {
	if prefix, _, ok := module.SplitPathVersion(importPath); ok {
		importPath = prefix
	}
	return path.Base(importPath)
}
