package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

// A proxy is a module proxy in a directory, in the layout GOPROXY=file://DIR
// reads ($module/@v/list, $version.info, .mod and .zip), made from the work
// tree as the Go module proxy makes it from a tag.
type proxy struct {
	dir string
}

// URL is the proxy's GOPROXY entry.
func (p proxy) URL() string {
	return "file://" + filepath.ToSlash(p.dir)
}

// publish writes module m of the repository at root into the proxy at
// version. The zip holds the files git would commit (tracked ones and
// untracked ones not ignored), less those of nested modules, vendor
// directories and other files the module zip format leaves out, exactly as
// golang.org/x/mod/zip, which the go command uses, decides.
func (p proxy) publish(root string, m mod, version string) error {
	mv := module.Version{Path: m.Path, Version: version}
	if err := module.Check(mv.Path, mv.Version); err != nil {
		return err
	}
	esc, err := module.EscapePath(m.Path)
	if err != nil {
		return err
	}
	escVer, err := module.EscapeVersion(version)
	if err != nil {
		return err
	}
	dir := filepath.Join(p.dir, filepath.FromSlash(esc), "@v")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	names, err := gitFiles(root, m.Dir)
	if err != nil {
		return err
	}
	moddir := filepath.Join(root, filepath.FromSlash(m.Dir))
	var files []zip.File
	for _, name := range names {
		files = append(files, zipFile{path: name, abs: filepath.Join(moddir, filepath.FromSlash(name))})
	}
	var buf bytes.Buffer
	if err := zip.Create(&buf, mv, files); err != nil {
		return fmt.Errorf("%s: %w", m.Path, err)
	}
	gomod, err := os.ReadFile(filepath.Join(moddir, "go.mod"))
	if err != nil {
		return err
	}
	info, _ := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, time.Now().UTC().Truncate(time.Second)})
	for name, data := range map[string][]byte{
		escVer + ".zip":  buf.Bytes(),
		escVer + ".mod":  gomod,
		escVer + ".info": info,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
	}
	list, _ := os.ReadFile(filepath.Join(dir, "list"))
	for _, v := range strings.Fields(string(list)) {
		if v == version {
			return nil
		}
	}
	return os.WriteFile(filepath.Join(dir, "list"), append(list, version+"\n"...), 0o644)
}

// gitFiles lists the files under dir (slash-separated, relative to root)
// that git would commit, relative to dir: tracked files still present and
// untracked files that .gitignore does not exclude.
func gitFiles(root, dir string) ([]string, error) {
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", ".")
	cmd.Dir = filepath.Join(root, filepath.FromSlash(dir))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files in %s: %v\n%s", dir, err, stderr.Bytes())
	}
	var names []string
	for _, name := range strings.Split(string(out), "\x00") {
		if name == "" {
			continue
		}
		// A tracked file deleted in the work tree is not published.
		if _, err := os.Lstat(filepath.Join(cmd.Dir, filepath.FromSlash(name))); err != nil {
			continue
		}
		names = append(names, name)
	}
	return names, nil
}

// zipFile is a file of the work tree, as golang.org/x/mod/zip reads one.
type zipFile struct {
	path string // slash-separated, relative to the module's directory
	abs  string
}

func (f zipFile) Path() string                 { return f.path }
func (f zipFile) Lstat() (os.FileInfo, error)  { return os.Lstat(f.abs) }
func (f zipFile) Open() (io.ReadCloser, error) { return os.Open(f.abs) }
