// Command idem-gateway is a reverse proxy that makes the services behind
// it idempotent, whatever their language: a protected request (POST and
// PATCH by default) with an idempotency key reaches its upstream once,
// and every retry gets the same response, from a store shared by every
// instance of the gateway (Redis, PostgreSQL or DynamoDB; memory for one
// instance).
// A duplicate that arrives while the first is still in flight gets 409
// with Retry-After.
//
//	idem-gateway -config gateway.yaml          # serve
//	idem-gateway -config gateway.yaml -check   # validate the file and exit
//	idem-gateway -reference                    # print every configuration field
//	idem-gateway -version                      # print its version and exit
//
// It is configured by one YAML file, every field checked at start (an
// error names the file, the line and the field). SIGTERM or SIGINT stop
// it: the listeners stop accepting, the requests in flight finish and
// their records are stored, then it exits 0 (1 when shutdown_grace ran
// out first). SIGHUP reloads the routes and upstreams from the file
// without dropping a connection; a file that does not load, or that
// changes what only a restart can (listeners, admin, store, instances),
// is refused, logged, and the running configuration kept.
//
// docs/gateway.md is the manual.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/idemkit/idem/internal/buildinfo"
)

// version is the release this binary was built as, when the build says so
// (-ldflags "-X main.version=v1.2.3": GoReleaser and the Dockerfile do);
// otherwise -version reads the module's version from the binary.
var version string

func main() {
	os.Exit(cli(os.Args[1:], os.Stdout, os.Stderr))
}

// cli runs the command with args and returns its exit status.
func cli(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("idem-gateway", flag.ContinueOnError)
	fs.SetOutput(stderr)
	file := fs.String("config", "idem-gateway.yaml", "the configuration file")
	check := fs.Bool("check", false, "validate the configuration file and exit: 0 when it is valid")
	reference := fs.Bool("reference", false, "print the configuration's fields, their defaults and meaning (Markdown), and exit")
	printVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "idem-gateway: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if *printVersion {
		fmt.Fprintln(stdout, buildinfo.Line("idem-gateway", version))
		return 0
	}
	if *reference {
		fmt.Fprint(stdout, configReference())
		return 0
	}
	cfg, err := loadConfig(*file)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if *check {
		fmt.Fprintf(stdout, "%s: valid\n", *file)
		return 0
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	g, err := newGateway(*file, cfg, stderr)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if err := g.run(ctx, hup); err != nil {
		g.log.Error("stopped", "err", err.Error())
		return 1
	}
	return 0
}

// loadConfig reads and validates a configuration file.
func loadConfig(file string) (*Config, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, ConfigErrors{{File: file, Msg: err.Error()}}
	}
	return parseConfig(file, data)
}

// logLevel parses a log level's name.
func logLevel(s string) (slog.Level, error) {
	var l slog.Level
	switch s {
	case "debug", "info", "warn", "error":
		return l, l.UnmarshalText([]byte(s))
	}
	return l, fmt.Errorf("%q: want debug, info, warn or error", s)
}
