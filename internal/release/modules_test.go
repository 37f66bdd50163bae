package main

import (
	"slices"
	"strings"
	"testing"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
)

// TestRepository: the repository's own modules can be released: every
// go.mod requires the others at one release version, with no replace, and
// the released modules are the libraries and the two commands.
func TestRepository(t *testing.T) {
	root, err := findRoot()
	if err != nil {
		t.Fatal(err)
	}
	mods, err := loadModules(root)
	if err != nil {
		t.Fatal(err)
	}
	version, err := requiredVersion(mods)
	if err != nil {
		t.Fatal(err)
	}
	var tags, binaries []string
	for _, m := range mods {
		if m.Released {
			tags = append(tags, m.Tag(version))
		}
		if m.Binary && m.Released {
			binaries = append(binaries, m.Path)
		}
		for _, r := range m.Siblings {
			if !m.Released {
				continue
			}
			for _, o := range mods {
				if o.Path == r.Mod.Path && !o.Released {
					t.Errorf("%s, released, requires %s, which is not", m.Path, o.Path)
				}
			}
		}
	}
	for _, want := range []string{version, "ginidem/" + version, "storage/redisstore/" + version, "cmd/idem-gateway/" + version, "cmd/idemctl/" + version} {
		if !slices.Contains(tags, want) {
			t.Errorf("tags %q lack %s", tags, want)
		}
	}
	for _, tag := range tags {
		if strings.HasPrefix(tag, "internal/") || strings.HasPrefix(tag, "examples/") {
			t.Errorf("tag %s: a module that is not released", tag)
		}
	}
	if want := []string{repoPath + "/cmd/idem-gateway", repoPath + "/cmd/idemctl"}; !slices.Equal(binaries, want) {
		t.Errorf("commands %q, want %q", binaries, want)
	}
}

func TestRequiredVersion(t *testing.T) {
	req := func(path, v string) modfile.Require {
		return modfile.Require{Mod: module.Version{Path: path, Version: v}}
	}
	good := []mod{
		{Dir: ".", Path: repoPath},
		{Dir: "ginidem", Path: repoPath + "/ginidem", Siblings: []modfile.Require{req(repoPath, "v0.2.0")}},
		{Dir: "cmd/x", Path: repoPath + "/cmd/x", Siblings: []modfile.Require{req(repoPath, "v0.2.0"), req(repoPath+"/ginidem", "v0.2.0")}},
	}
	if v, err := requiredVersion(good); v != "v0.2.0" || err != nil {
		t.Errorf("requiredVersion = %q, %v", v, err)
	}
	for _, tc := range []struct {
		name string
		mods []mod
		want string
	}{
		{"pseudo-version", []mod{{Dir: "a", Siblings: []modfile.Require{req(repoPath, "v0.0.0-00010101000000-000000000000")}}}, "pseudo-version"},
		{"two versions", []mod{good[1], {Dir: "b", Siblings: []modfile.Require{req(repoPath, "v0.1.0")}}}, "released together"},
		{"replace", []mod{good[1], {Dir: "b", Replaces: []*modfile.Replace{{Old: module.Version{Path: repoPath}}}}}, "no replace directive"},
		{"build metadata", []mod{{Dir: "a", Siblings: []modfile.Require{req(repoPath, "v0.1.0+meta")}}}, "not a release version"},
		{"nothing", []mod{good[0]}, "nothing says which version"},
	} {
		if _, err := requiredVersion(tc.mods); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
		}
	}
}

func TestChangelog(t *testing.T) {
	log, err := parseChangelog("# Changelog\n\n## [Unreleased]\n\n## [0.3.0] - 2027-02-01\n\n- `idem.X` removed\n\n## [0.2.1] - 2027-01-10\n\nfix\n\n## [0.2.0] - 2027-01-01\n")
	if err != nil {
		t.Fatal(err)
	}
	if text, ok := log.section("v0.3.0"); !ok || !strings.Contains(text, "`idem.X`") || strings.Contains(text, "fix") {
		t.Errorf("section(v0.3.0) = %q, %v", text, ok)
	}
	if _, ok := log.section("v0.4.0"); ok {
		t.Error("section(v0.4.0) found")
	}
	for v, want := range map[string]string{"v0.3.0": "v0.2.1", "v0.2.1": "v0.2.0", "v0.2.0": "", "v0.4.0": "v0.3.0"} {
		if got := log.previous(v); got != want {
			t.Errorf("previous(%s) = %q, want %q", v, got, want)
		}
	}
	if _, err := parseChangelog("## 0.1.0\n"); err == nil {
		t.Error("a heading without brackets parsed")
	}
}
