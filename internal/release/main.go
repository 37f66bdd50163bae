// Command release checks that the repository can be released at a version
// and says how: every module is released together, at one version, each
// requiring the others at that version (RELEASING.md).
//
//	go run ./internal/release check [-core-go TOOLCHAIN] [-keep] [VERSION]
//	go run ./internal/release tags [VERSION]
//	go run ./internal/release bump VERSION
//	go run ./internal/release publish DIR [VERSION]
//
// check publishes the work tree at VERSION into a file module proxy (module
// zips made with golang.org/x/mod/zip from the files git would commit, as
// the Go module proxy makes them from a tag) and uses it as a user outside
// the repository would, each step in an empty module with GOWORK=off and a
// module cache of its own:
//   - go get each library module alone at VERSION, and build its packages;
//     then go mod tidy a program that imports every package of its API;
//   - go install each command at VERSION, and run it with -version, which
//     must print VERSION;
//   - build a service on the core module with the core's go directive (Go
//     1.25; -core-go names the toolchain, "local" by default), and check
//     that its go.sum holds no third-party module;
//   - compare each library module's exported API with the release before
//     VERSION in CHANGELOG.md, fetched through the usual proxy, and fail on
//     an incompatible change that CHANGELOG.md's section for VERSION does
//     not name.
//
// Every step that fails prints its command and output, and check exits 1.
// When every step passes, it prints the tags to push. VERSION is by default
// the version at which the modules require each other; any other is an
// error (bump first).
//
// tags prints the tags of a release. bump makes every module require the
// others at VERSION, and go.work replace that version by the work tree.
// publish writes the file proxy alone, for a check by hand (GOPROXY=file://DIR).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

const usage = `usage:
  go run ./internal/release check [-core-go TOOLCHAIN] [-keep] [VERSION]
  go run ./internal/release tags [VERSION]
  go run ./internal/release bump VERSION
  go run ./internal/release publish DIR [VERSION]`

// run runs the command args in the repository that holds the working
// directory.
func run(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%w\n%s", flag.ErrHelp, usage)
	}
	root, err := findRoot()
	if err != nil {
		return err
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	coreGo := fs.String("core-go", "local", "the toolchain that builds the consumer of the core module")
	keep := fs.Bool("keep", false, "keep the scratch directory, and print where it is")
	if err := fs.Parse(args[1:]); err != nil {
		return fmt.Errorf("%w\n%s", err, usage)
	}
	mods, err := loadModules(root)
	if err != nil {
		return err
	}
	switch args[0] {
	case "bump":
		if fs.NArg() != 1 {
			return fmt.Errorf("%w\n%s", flag.ErrHelp, usage)
		}
		return bump(root, mods, fs.Arg(0), out)
	case "check", "tags", "publish":
	default:
		return fmt.Errorf("unknown command %q\n%s", args[0], usage)
	}
	version, err := requiredVersion(mods)
	if err != nil {
		return err
	}
	rest := fs.Args()
	if args[0] == "publish" {
		if len(rest) == 0 {
			return fmt.Errorf("%w\n%s", flag.ErrHelp, usage)
		}
		dir, err := filepath.Abs(rest[0])
		if err != nil {
			return err
		}
		if err := wantVersion(version, rest[1:]); err != nil {
			return err
		}
		p := proxy{dir: dir}
		for _, m := range mods {
			if m.Released {
				if err := p.publish(root, m, version); err != nil {
					return err
				}
			}
		}
		fmt.Fprintf(out, "published %d modules at %s: GOPROXY=%s,$(go env GOPROXY) GONOSUMDB=%s GOWORK=off\n", countReleased(mods), version, p.URL(), repoPath)
		return nil
	}
	if err := wantVersion(version, rest); err != nil {
		return err
	}
	if args[0] == "tags" {
		printTags(out, mods, version)
		return nil
	}
	work, err := os.MkdirTemp("", "idem-release-")
	if err != nil {
		return err
	}
	if *keep {
		fmt.Fprintf(out, "scratch directory: %s\n", work)
	} else {
		defer os.RemoveAll(work)
	}
	c := &checker{root: root, mods: mods, version: version, coreGo: *coreGo, out: out, work: work}
	if err := c.run(ctx); err != nil {
		return err
	}
	if err := c.compatible(ctx); err != nil {
		return err
	}
	fmt.Fprintf(out, "\n%s is ready to release. Push these tags on the commit checked:\n", version)
	printTags(out, mods, version)
	return nil
}

// wantVersion checks that the version asked for, if any, is the one the
// modules require of each other.
func wantVersion(version string, args []string) error {
	switch {
	case len(args) > 1:
		return fmt.Errorf("%w\n%s", flag.ErrHelp, usage)
	case len(args) == 1 && args[0] != version:
		return fmt.Errorf("the modules require each other at %s, not %s: run `go run ./internal/release bump %s` first", version, args[0], args[0])
	}
	return nil
}

// printTags prints the tag of every released module at version, a line
// each.
func printTags(out io.Writer, mods []mod, version string) {
	for _, m := range mods {
		if m.Released {
			fmt.Fprintln(out, m.Tag(version))
		}
	}
}

// findRoot is the directory of go.work above the working directory, where
// the core module is.
func findRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			if data, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.Contains(string(data), "module "+repoPath+"\n") {
				return dir, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not in the idem repository (no go.work beside the core module's go.mod above the working directory)")
		}
		dir = parent
	}
}
