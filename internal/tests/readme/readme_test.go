package readme

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestREADME: every ```go block of README.md and of the manual
// (docs/manual.md) compiles (see the package comment for the two kinds of
// block).
func TestREADME(t *testing.T) {
	t.Parallel()
	goCmd := lookGo(t)
	root := moduleRoot(t)
	for _, doc := range []struct{ path, dir string }{{"README.md", "readme"}, {"docs/manual.md", "manual"}} {
		md, err := os.ReadFile(filepath.Join(root, "..", "..", filepath.FromSlash(doc.path)))
		if err != nil {
			t.Fatal(err)
		}
		blocks, err := extract(string(md))
		if err != nil {
			t.Fatalf("%s:%v", doc.path, err)
		}
		if len(blocks) == 0 {
			t.Fatalf("%s has no ```go block: the extraction is broken", doc.path)
		}
		for _, err := range check(t, goCmd, root, doc.path, doc.dir, blocks) {
			t.Error(err)
		}
	}
}

// TestCheckFindsErrors: the check reports, each at its line, a complete
// program that does not compile, a fragment without its comment, a
// fragment with a type error and one with an unused import, and passes the
// good blocks: a fragment declaring an unused variable, declarations, an
// elided body.
func TestCheckFindsErrors(t *testing.T) {
	t.Parallel()
	goCmd := lookGo(t)
	md := strings.Join([]string{
		"# A broken README",                      //  1
		"",                                       //  2
		"```go",                                  //  3
		"package main",                           //  4
		"",                                       //  5
		"func main() { undefinedFunction() }",    //  6
		"```",                                    //  7
		"",                                       //  8
		"```go",                                  //  9
		"x := 1",                                 // 10
		"```",                                    // 11
		"",                                       // 12
		"<!-- snippet: imports=time -->",         // 13
		"```go",                                  // 14
		"d := time.Second",                       // 15
		`var s string = d`,                       // 16
		"```",                                    // 17
		"",                                       // 18
		"<!-- snippet: imports=fmt,net/http -->", // 19
		"",                                       // 20
		"```go",                                  // 21
		`fmt.Println("unused net/http")`,         // 22
		"```",                                    // 23
		"",                                       // 24
		"<!-- snippet: imports=time -->",         // 25
		"```go",                                  // 26
		"deadline := time.Now()",                 // 27
		"```",                                    // 28
		"",                                       // 29
		"<!-- snippet: imports=net/http -->",     // 30
		"```go",                                  // 31
		"func handle(w http.ResponseWriter, r *http.Request) error { ... }", // 32
		"",                       // 33
		"type T struct{ N int }", // 34
		"```",                    // 35
		"",                       // 36
		"- a list item:",         // 37
		"",                       // 38
		"  ```go",                // 39
		"  package main",         // 40
		"",                       // 41
		"  func main() {}",       // 42
		"  ```",                  // 43
	}, "\n") + "\n"
	blocks, err := extract(md)
	if err != nil {
		t.Fatal(err)
	}
	if len(blocks) != 7 {
		t.Fatalf("extracted %d blocks, want 7: %+v", len(blocks), blocks)
	}
	var got []string
	for _, err := range check(t, goCmd, moduleRoot(t), "BROKEN.md", "broken", blocks) {
		got = append(got, err.Error())
	}
	want := []*regexp.Regexp{
		regexp.MustCompile(`^BROKEN\.md:3: .*does not compile(.|\n)*BROKEN\.md:6:\d+: undefined: undefinedFunction`),
		regexp.MustCompile(`^BROKEN\.md:9: a fragment .*<!-- snippet`),
		regexp.MustCompile(`^BROKEN\.md:14: .*does not compile(.|\n)*BROKEN\.md:16:\d+: cannot use d`),
		regexp.MustCompile(`^BROKEN\.md:21: .*does not compile(.|\n)*BROKEN\.md:19:\d+: "net/http" imported and not used`),
	}
	if len(got) != len(want) {
		t.Fatalf("got %d problems, want %d:\n%s", len(got), len(want), strings.Join(got, "\n---\n"))
	}
	for i, re := range want {
		if !re.MatchString(got[i]) {
			t.Errorf("problem %d:\n%s\ndoes not match %s", i, got[i], re)
		}
	}
}

// TestExtract: fences, indentation, comments and their errors.
func TestExtract(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, md string
		want     []block // compared on line, code, fragment, imports
		err      string
	}{
		{name: "other languages are skipped", md: "```sh\ngo test\n```\n```text\nx\n```\n"},
		{
			name: "complete file",
			md:   "text\n```go\npackage main\n```\n",
			want: []block{{line: 2, code: "package main\n"}},
		},
		{
			name: "fragment with imports, blank line before the fence",
			md:   "<!-- snippet: imports=time,net/http -->\n\n```go\nx := 1\n```\n",
			want: []block{{line: 3, code: "x := 1\n", fragment: true, comment: 1, imports: []string{"time", "net/http"}}},
		},
		{
			name: "fragment without imports, indented fence",
			md:   "- item\n  <!-- snippet -->\n  ```go\n  x := 1\n  ```\n",
			want: []block{{line: 3, code: "x := 1\n", fragment: true, comment: 2}},
		},
		{name: "unclosed", md: "a\n```go\npackage main\n", err: "2: ```go block not closed"},
		{name: "unknown setting", md: "<!-- snippet: import=time -->\n```go\nx := 1\n```\n", err: `1: unknown setting "import=time" in the snippet comment (imports=a,b only)`},
		{name: "comment on a complete file", md: "<!-- snippet -->\n```go\npackage main\n```\n", err: "2: a complete file (package clause) takes no <!-- snippet --> comment"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := extract(tc.md)
			if tc.err != "" {
				if err == nil || err.Error() != tc.err {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// block is one ```go block of a Markdown file.
type block struct {
	line     int    // of the opening fence, from 1
	code     string // without the fence's indentation
	fragment bool   // not a complete file
	comment  int    // line of its <!-- snippet --> comment; 0: none
	imports  []string
}

var snippetComment = regexp.MustCompile(`^<!--\s*snippet(:.*?)?\s*-->$`)

// extract returns the ```go blocks of md. A fragment without its comment
// is returned (and refused by check); a malformed comment or an unclosed
// fence is an error "LINE: what".
func extract(md string) ([]block, error) {
	lines := strings.Split(md, "\n")
	var blocks []block
	lastText := -1 // index of the last non-blank line outside blocks
	for i := 0; i < len(lines); i++ {
		trimmed := strings.TrimSpace(lines[i])
		if !strings.HasPrefix(trimmed, "```") {
			if trimmed != "" {
				lastText = i
			}
			continue
		}
		indent := lines[i][:len(lines[i])-len(strings.TrimLeft(lines[i], " \t"))]
		open, isGo := i, trimmed == "```go"
		var code strings.Builder
		for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "```"; i++ {
			code.WriteString(strings.TrimPrefix(lines[i], indent))
			code.WriteByte('\n')
		}
		if i == len(lines) {
			return nil, fmt.Errorf("%d: %s block not closed", open+1, trimmed)
		}
		if !isGo {
			lastText = i
			continue
		}
		b := block{line: open + 1, code: code.String()}
		_, err := parser.ParseFile(token.NewFileSet(), "", b.code, parser.PackageClauseOnly)
		b.fragment = err != nil
		if lastText >= 0 {
			if m := snippetComment.FindStringSubmatch(strings.TrimSpace(lines[lastText])); m != nil {
				if !b.fragment {
					return nil, fmt.Errorf("%d: a complete file (package clause) takes no <!-- snippet --> comment", b.line)
				}
				b.comment = lastText + 1
				for _, setting := range strings.Fields(strings.TrimPrefix(m[1], ":")) {
					list, ok := strings.CutPrefix(setting, "imports=")
					if !ok {
						return nil, fmt.Errorf("%d: unknown setting %q in the snippet comment (imports=a,b only)", b.comment, setting)
					}
					for _, p := range strings.Split(list, ",") {
						if p != "" {
							b.imports = append(b.imports, p)
						}
					}
				}
			}
		}
		blocks = append(blocks, b)
		lastText = i
	}
	return blocks, nil
}

// check builds blocks, taken from the Markdown file name, with the go
// command goCmd in the module at root (internal/tests, which requires every
// module of the kit), each as a package of its own under
// readme/overlay/<dir>, and returns one error per block that is
// refused or does not compile, starting "NAME:LINE: ". The build runs in
// the go.work, offline: it selects the module versions the rest of the
// suite built with, so they are in the module cache already.
func check(t *testing.T, goCmd, root, name, dir string, blocks []block) []error {
	t.Helper()
	tmp := t.TempDir()
	overlay := map[string]string{}
	byPkg := map[string]block{}
	var pkgs []string
	var errs []error
	for _, b := range blocks {
		src, err := generate(name, b)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s:%d: %w", name, b.line, err))
			continue
		}
		rel := path.Join("readme/overlay", dir, "l"+strconv.Itoa(b.line))
		file := filepath.Join(tmp, "l"+strconv.Itoa(b.line)+".go")
		if err := os.WriteFile(file, src, 0o644); err != nil {
			t.Fatal(err)
		}
		overlay[filepath.Join(root, filepath.FromSlash(rel), "snippet.go")] = file
		pkg := "github.com/idemkit/idem/internal/tests/" + rel
		pkgs = append(pkgs, pkg)
		byPkg[pkg] = b
	}
	if len(pkgs) == 0 {
		return errs
	}
	js, err := json.Marshal(map[string]any{"Replace": overlay})
	if err != nil {
		t.Fatal(err)
	}
	overlayFile := filepath.Join(tmp, "overlay.json")
	if err := os.WriteFile(overlayFile, js, 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"build", "-overlay=" + overlayFile}
	if len(pkgs) == 1 {
		// A single main package (the README's one block, its quick
		// start) would leave its binary in root: internal/tests/l39.
		// With several, go build discards what it builds.
		args = append(args, "-o", filepath.Join(tmp, "bin")+string(filepath.Separator))
	}
	cmd := exec.Command(goCmd, append(args, pkgs...)...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=readonly", "GOPROXY=off", "GOTOOLCHAIN=local")
	out, err := cmd.CombinedOutput()
	if err == nil {
		return errs
	}
	// The output is a section per failing package: "# PKG" and its errors.
	var unattributed strings.Builder
	var failed []block
	sections := map[int]string{}
	sectionsOut := strings.Split("\n"+string(out), "\n# ")
	unattributed.WriteString(strings.TrimSpace(sectionsOut[0])) // before any "# PKG"
	for _, section := range sectionsOut[1:] {
		pkg, body, _ := strings.Cut(section, "\n")
		body = strings.TrimSuffix(body, "\n")
		b, ok := byPkg[pkg]
		if !ok {
			unattributed.WriteString("# " + pkg + "\n" + body + "\n")
			continue
		}
		failed = append(failed, b)
		sections[b.line] = body
	}
	for _, b := range blocks { // in the file's order
		if body, ok := sections[b.line]; ok {
			errs = append(errs, fmt.Errorf("%s:%d: this ```go block does not compile:\n%s", name, b.line, body))
		}
	}
	if len(failed) == 0 || unattributed.Len() > 0 {
		errs = append(errs, fmt.Errorf("go build: %v\n%s", err, out))
	}
	sortByLine(errs, name)
	return errs
}

// sortByLine orders errors "NAME:LINE: ..." by LINE, others last.
func sortByLine(errs []error, name string) {
	line := func(err error) int {
		s, ok := strings.CutPrefix(err.Error(), name+":")
		if !ok {
			return 1 << 30
		}
		n, _ := strconv.Atoi(s[:strings.IndexByte(s+":", ':')])
		return n
	}
	for i := 1; i < len(errs); i++ {
		for j := i; j > 0 && line(errs[j]) < line(errs[j-1]); j-- {
			errs[j], errs[j-1] = errs[j-1], errs[j]
		}
	}
}

var elided = regexp.MustCompile(`\{ \.\.\. \}`)

// generate returns the Go file that stands for b. Its //line directives
// put b's code, and each of its imports, at their lines in name.
func generate(name string, b block) ([]byte, error) {
	at := func(line int) string { return fmt.Sprintf("//line %s:%d:1\n", name, line) }
	if !b.fragment {
		if formatted, err := format.Source([]byte(b.code)); err == nil && !bytes.Equal(formatted, []byte(b.code)) {
			return nil, errors.New("this complete file is not gofmt-formatted")
		}
		return []byte(at(b.line+1) + b.code), nil
	}
	if b.comment == 0 {
		return nil, errors.New("a fragment (a ```go block without a package clause) must be preceded by" +
			" <!-- snippet: imports=path,path --> naming the packages it uses, or <!-- snippet --> (see internal/readme)")
	}
	code := elided.ReplaceAllString(b.code, `{ panic("elided") }`)
	var src strings.Builder
	src.WriteString("package snippet\n\n")
	for _, p := range b.imports {
		src.WriteString(at(b.comment) + "import " + strconv.Quote(p) + "\n")
	}
	src.WriteString("\n")
	if _, err := parser.ParseFile(token.NewFileSet(), "", "package p\n"+code, 0); err == nil {
		src.WriteString(at(b.line+1) + code) // declarations
		return []byte(src.String()), nil
	}
	// Statements: the body of a function, then each variable they declare
	// at their top level is used.
	body := "func _() {\n" + at(b.line+1) + code + "}\n"
	f, err := parser.ParseFile(token.NewFileSet(), "", "package p\n"+body, parser.SkipObjectResolution)
	if err != nil {
		// Not Go: the compiler reports where, at the block's lines.
		src.WriteString(body)
		return []byte(src.String()), nil
	}
	var used strings.Builder
	for _, stmt := range f.Decls[0].(*ast.FuncDecl).Body.List {
		var names []*ast.Ident
		switch s := stmt.(type) {
		case *ast.AssignStmt:
			if s.Tok == token.DEFINE {
				for _, e := range s.Lhs {
					if id, ok := e.(*ast.Ident); ok {
						names = append(names, id)
					}
				}
			}
		case *ast.DeclStmt:
			if g, ok := s.Decl.(*ast.GenDecl); ok && g.Tok == token.VAR {
				for _, spec := range g.Specs {
					names = append(names, spec.(*ast.ValueSpec).Names...)
				}
			}
		}
		for _, id := range names {
			if id.Name != "_" {
				used.WriteString("\t_ = " + id.Name + "\n")
			}
		}
	}
	src.WriteString("func _() {\n" + at(b.line+1) + code + used.String() + "}\n")
	return []byte(src.String()), nil
}

// lookGo returns the go command, or skips t when there is none.
func lookGo(t *testing.T) string {
	t.Helper()
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH: the README's Go blocks are not checked")
	}
	return goCmd
}

// moduleRoot returns the directory of this module's go.mod (internal/tests).
func moduleRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatal(err)
	}
	return root
}
