// Package readme holds the test that every ```go block of the repository's
// README.md and of its manual (docs/manual.md) compiles against the kit as
// it is. It has no code of its own.
//
// A block with a package clause (usually package main) is a complete file:
// it is built as it stands, as a package of its own, and must be
// gofmt-formatted.
//
// Any other block is a fragment. It must be preceded (blank lines aside)
// by an HTML comment, which GitHub does not show, naming the packages it
// uses, or <!-- snippet --> when it imports none:
//
//	<!-- snippet: imports=time,github.com/redis/go-redis/v9 -->
//
// A fragment made of declarations (func, type, var, const) is put at the
// top level of a generated file with those imports; one made of statements
// becomes the body of a function, followed by `_ = v` for each variable it
// declares at its top level, so a snippet may leave a variable unused. A
// body elided as `{ ... }` stands for one that panics.
//
// Each block is a package of its own, built with `go build -overlay`, so
// nothing is written into the source tree, and offline (GOPROXY=off, no
// workspace, the local toolchain): only the modules of go.mod and go.sum
// are used. //line directives map every error, an unused import included,
// to its line in README.md.
package readme
