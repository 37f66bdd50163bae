package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/semver"
)

// bump makes every module require the others at version and go.work
// replace each module at that version by its directory, so that the
// workspace never looks the version up. It writes only files that change.
func bump(root string, mods []mod, version string, out io.Writer) error {
	if !semver.IsValid(version) || semver.Canonical(version) != version || semver.Build(version) != "" {
		return fmt.Errorf("%q is not a release version such as v0.2.0", version)
	}
	for _, m := range mods {
		path := filepath.Join(root, filepath.FromSlash(m.Dir), "go.mod")
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		f, err := modfile.Parse(path, data, nil)
		if err != nil {
			return err
		}
		for _, r := range m.Siblings {
			if err := f.AddRequire(r.Mod.Path, version); err != nil {
				return err
			}
		}
		if err := rewrite(path, data, f.Format, out); err != nil {
			return err
		}
	}
	path := filepath.Join(root, "go.work")
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	w, err := modfile.ParseWork(path, data, nil)
	if err != nil {
		return err
	}
	for _, r := range append([]*modfile.Replace(nil), w.Replace...) {
		if err := w.DropReplace(r.Old.Path, r.Old.Version); err != nil {
			return err
		}
	}
	for _, m := range mods {
		dir := "./" + m.Dir
		if m.Dir == "." {
			dir = "."
		}
		if err := w.AddReplace(m.Path, version, dir, ""); err != nil {
			return err
		}
	}
	w.Cleanup()
	return rewrite(path, data, func() ([]byte, error) { return modfile.Format(w.Syntax), nil }, out)
}

// rewrite writes format's text to path if it differs from data.
func rewrite(path string, data []byte, format func() ([]byte, error), out io.Writer) error {
	text, err := format()
	if err != nil {
		return err
	}
	if string(text) == string(data) {
		return nil
	}
	fmt.Fprintf(out, "rewrote %s\n", path)
	return os.WriteFile(path, text, 0o644)
}
