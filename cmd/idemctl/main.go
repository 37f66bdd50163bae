// Command idemctl shows an operator what an idem store holds, and removes
// an entry by hand: "why does this retry get 409?", "which executions are
// stuck, and since when?", "forget this key, the order was refunded by
// hand". It works on the stores a service shares, Redis (redisstore),
// PostgreSQL (pgstore), MySQL or MariaDB (sqlstore) and Amazon DynamoDB
// (dynamostore), through their storage.Inspector, and prints what
// package idemadmin shows: its JSON with -json.
//
//	idemctl [global flags] inspect [-body] [key flags] KEY
//	idemctl [global flags] ls [-in-flight | -done | -committed | -issued] [-older-than D] [-limit N] [-cursor C | -all]
//	idemctl [global flags] rm [-yes] [key flags] KEY
//	idemctl [global flags] rm [-yes | -dry-run] -in-flight | -done | -committed -older-than D
//	idemctl [global flags] stats
//
// For example:
//
//	idemctl -redis localhost:6379 ls -in-flight -older-than 1m
//	IDEMCTL_SCOPE="$AUTH" idemctl -pg "$DATABASE_URL" inspect -method POST -route 'POST /orders' order-42
//	idemctl -redis localhost:6379 -json stats
//	idemctl -dynamodb orders_idem -region eu-west-1 ls -in-flight -older-than 1m
//
// The global flags come before the command, the command's own flags after
// it and before KEY. They name exactly one store: -redis host:port
// ($IDEM_REDIS_ADDR), -redis-url redis://... (a password, a database,
// TLS with rediss://), or -redis-cluster host:port,... for a Redis
// Cluster ($IDEM_REDIS_CLUSTER), with -prefix, the store's key prefix
// (redisstore.WithPrefix; default "idem:"); or -pg DSN ($IDEM_PG_DSN),
// or -mysql DSN ($IDEM_MYSQL_DSN; go-sql-driver/mysql's, naming the
// database: user:password@tcp(host:3306)/dbname), with -table, the
// store's table (pgstore.WithTable, sqlstore.WithTable; default
// "idem_keys"); or -dynamodb TABLE ($IDEM_DYNAMODB_TABLE), the table of a
// dynamostore. A DynamoDB store is reached as the AWS SDK's default
// configuration says (config.LoadDefaultConfig: AWS_REGION, AWS_PROFILE,
// the keys in the environment or in ~/.aws, a role), with -region R over
// its region, and -endpoint URL for DynamoDB Local, dynalite or
// LocalStack (http://localhost:8000): there the region defaults to
// us-east-1, and the credentials to dummy ones unless the environment
// names some (AWS_ACCESS_KEY_ID, AWS_PROFILE, ...). idemctl checks the
// table first (a DescribeTable), so a wrong table, region or account is
// an error that names the region, not "no such entry"; it needs
// dynamodb:DescribeTable, GetItem, Scan (ls, stats, rm of many) and
// DeleteItem (rm). The environment is read only when no store flag is
// given. idemctl never prints a DSN, a URL or a password. -json prints JSON
// instead of text; -timeout (default 30s) bounds the command, except for
// the time rm waits for its answer.
//
// inspect shows one entry, one field per line: its key, state, since when
// (and how long ago), the lease left (in flight or committed), when the
// store forgets it, and for a done entry the size of its record and the
// status, content type and body size of its response. -body adds the
// stored headers and the body, which are never printed without it (they
// hold what the application sent to its client). A body that is not
// UTF-8 text of a textual content type (text/*, JSON, XML, ...; or none,
// as Middleware.Do's results) is printed in base64, and says so; with
// -json the body is a string, "body_encoding" saying "text" or "base64"
// (see idemadmin.Response).
//
// KEY is the storage key, as ls lists it (idem.Info.StorageKey); one that
// starts with "-" (about one in 64) is taken as KEY when it is the last
// argument and no flag, or follows "--" (which ls's hint prints). Or name
// the entry as the middleware derives it from the client's key: -scope S
// -method M -route R KEY for a request's key (S is what the middleware's
// scope function returns, by default the principal named with
// idem.ContextWithPrincipal; R the route as the adapter names it: net/http's mux pattern such
// as "POST /orders", Gin's c.FullPath(), Echo's c.Path()); -op OP KEY for
// Middleware.Do's (with -scope S for a call made WithCallScope); -issued
// -scope S KEY for a key issued under idem.WithIssuedKeys. See
// idem.StorageKey. The client's key is read as the middleware reads the
// key header (idem.ParseKey): "order-42" in RFC 8941 quotes, as the IETF
// draft has clients send it, names the same entry as order-42, and a key
// the middleware refuses (empty, over 255 bytes, a character outside
// printable ASCII) is a usage error. With -op the key is taken as it
// stands, as Middleware.Do takes it (idem.CheckKey).
//
// A scope that is a bearer token on the command line shows in ps and the
// shell's history: without -scope, a request's and an issued key's scope
// is $IDEMCTL_SCOPE (-scope "" for the empty scope); -scope - reads it
// from the first line of standard input, which rm, reading its answer
// there, refuses unless given -yes. -op takes -scope only: a Do call's
// scope is a name of the application's, not a credential.
//
// ls lists the entries of one state (-in-flight, -done, -committed,
// -issued; all of them without), those that entered it at least
// -older-than ago (such as the executions in flight for more than a
// minute), one line each: KEY STATE AGE LEASE-LEFT EXPIRES-IN SIZE. It
// prints at most -limit entries (default 100), oldest first, and when the
// listing goes on, a last line with the command that prints the next
// ones, -cursor C (in JSON: "more": true and "next": C; a page may then
// hold no entry while more follow). PostgreSQL and MySQL list the entries of one
// state oldest first, so a page holds the oldest; Redis lists in SCAN
// order and DynamoDB in the table's order (a Scan), so there a page
// holds the first entries found. -all prints every entry, a page of the
// store at a time as it reads it, each page oldest first, in memory that
// does not grow with the store (on Redis an entry may show twice). On
// DynamoDB every listing reads the whole table, and pays for it.
//
// rm looks the entry up, shows it and asks "remove it? [y/N]" on
// standard error, and removes it only when the answer, read from standard
// input, is y or yes, and only if it is still the entry shown: the store
// compares its version and removes it in one step. If it changed
// meanwhile (the execution shown in flight completed, say), rm removes
// nothing, prints the entry as it is now, says so, and exits 5: run it
// again to remove it as it is now. -yes removes without asking, what the
// look-up showed, likewise. It prints the entry as it was removed. The key
// is then free: the next request with it runs the handler again (for an
// issued key: the key is spent). rm of an entry in flight warns that its
// handler may still be running: the next request with its key runs the
// handler again even while the first still runs (whose response is then
// not stored); of a committed one, that the work ran, and a retry runs it
// again. While a transaction that fenced the entry (pgstore's or sqlstore's Store.Fence)
// is open, nothing is removed: try again.
//
// rm -in-flight -older-than D (or -done, or -committed; both flags are
// required, -older-than 0s for every age) removes many: it lists every
// entry of that state at least D old, prints them, stops there with
// -dry-run, else asks "remove these N entries? [y/N]" (-yes does not),
// and removes each only if it is still as listed (in flight under the
// same owner, say). It prints a line for each, removed, changed (kept, as
// it is now), gone (removed or expired meanwhile) or locked, and the
// counts; with -json, {"removed": [...], "changed": [...], "gone": [keys]}.
// It exits 5 when an entry changed, 1 when one was locked.
//
// stats counts the entries by state, and names the oldest in flight. It
// reads every entry of the store: on a large store it takes a while.
//
// Exit status: 0 done; 1 the store failed or could not be reached, or the
// entry is locked by a transaction; 2 a usage error (a bad flag, no store
// or two, no KEY or a bad one); 3 no such entry (inspect, rm); 4 rm was not
// confirmed; 5 rm removed nothing because the entry changed since it was
// shown (of many: some changed since they were listed).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/idemkit/idem/internal/buildinfo"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/pgstore"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/idemkit/idem/storage/sqlstore"
)

// version is the release this binary was built as, when the build says so
// (-ldflags "-X main.version=v1.2.3": GoReleaser does); otherwise -version
// reads the module's version from the binary.
var version string

// help is what idemctl -h prints.
const help = `idemctl shows what an idem store holds, and removes an entry by hand.

Usage:

  idemctl [global flags] inspect [-body] [key flags] KEY
  idemctl [global flags] ls [-in-flight | -done | -committed | -issued] [-older-than D] [-limit N] [-cursor C | -all]
  idemctl [global flags] rm [-yes] [key flags] KEY
  idemctl [global flags] rm [-yes | -dry-run] -in-flight | -done | -committed -older-than D
  idemctl [global flags] stats

  idemctl -redis localhost:6379 ls -in-flight -older-than 1m
  IDEMCTL_SCOPE="$AUTH" idemctl -pg "$DATABASE_URL" inspect -method POST -route 'POST /orders' order-42
  idemctl -dynamodb orders_idem -region eu-west-1 ls -in-flight -older-than 1m

Global flags, before the command. Exactly one store:

  -redis host:port           Redis ($IDEM_REDIS_ADDR)
  -redis-url URL             Redis by URL: redis://user:password@host:port/db, rediss:// for TLS
  -redis-cluster host:port,...
                             a Redis Cluster, by some of its nodes ($IDEM_REDIS_CLUSTER)
  -prefix P                  the Redis store's key prefix (default "` + redisstore.DefaultPrefix + `")
  -pg DSN                    PostgreSQL ($IDEM_PG_DSN)
  -mysql DSN                 MySQL or MariaDB ($IDEM_MYSQL_DSN): user:password@tcp(host:3306)/dbname
  -table T                   the PostgreSQL or MySQL store's table (default "` + pgstore.DefaultTable + `")
  -dynamodb TABLE            an Amazon DynamoDB table ($IDEM_DYNAMODB_TABLE), reached as the AWS SDK's
                             default configuration says (AWS_REGION, AWS_PROFILE, ~/.aws, a role)
  -region R                  the DynamoDB table's AWS region (default: the SDK's; us-east-1 with -endpoint)
  -endpoint URL              a DynamoDB API of its own: DynamoDB Local, dynalite (http://localhost:8000);
                             dummy credentials unless the environment names some

  The environment is read only when no store flag is given.

  -json                      print JSON (package idemadmin's) instead of text
  -timeout D                 bound the command, but for rm's question (default 30s)
  -version                   print idemctl's version and exit

Commands:

  inspect KEY   one entry, a field per line; for a done entry its response's
                status, content type and body size
      -body     also print the stored headers and body (in base64 when it is
                not text; with -json, "body_encoding" says text or base64)

  ls            the entries, oldest first: KEY STATE AGE LEASE-LEFT EXPIRES-IN SIZE
      -in-flight, -done, -committed, -issued
                only the entries in that state (default: all)
      -older-than D
                only those in their state for at least D, such as 1m
      -limit N  print at most N entries (default 100), and when there are
                more, the command that goes on (on Redis and DynamoDB, the
                first found)
      -cursor C go on where a page ended (JSON: its "next")
      -all      print every entry, page after page (on Redis, maybe twice)

  rm KEY        show the entry, ask "remove it? [y/N]" on stderr, and on y or
                yes remove it if it is still the entry shown, and print it as
                it was; the next request with its key runs the handler again.
                If it changed meanwhile: nothing removed, shown as it is now,
                exit 5. An entry in flight: its handler may still be running
      -yes      do not ask (what the look-up shows is removed, likewise)

  rm -in-flight -older-than D     (or -done, -committed; -older-than 0s: any age)
                list the entries of that state at least D old, ask "remove
                these N entries? [y/N]", and remove each that is still as
                listed; print removed, changed, gone; exit 5 if one changed
      -dry-run  list them only
      -yes      do not ask

  stats         the entries by state, and the oldest in flight (reads them all)

KEY is the storage key, as ls lists it (one starting with "-" may follow "--"),
or, with key flags, the key the client sent, read as the middleware reads the
header ("order-42" in RFC 8941 quotes is order-42; a key it refuses is a
usage error), named as the middleware does:

  -scope S -method M -route R KEY   a request's key: S is what the scope function
                                    returns (by default the principal the app's auth named),
                                    R the route, such as 'POST /orders'
  -op OP [-scope S] KEY             Middleware.Do's key for the operation OP (-scope: WithCallScope's),
                                    taken as it stands, as Do takes it
  -issued -scope S KEY              a key issued under WithIssuedKeys

  Without -scope, a request's or an issued key's scope is $IDEMCTL_SCOPE, out of
  ps and the shell's history; -scope - reads it from a line of stdin (not with
  rm's question: use the variable, or -yes).

Exit status: 0 done; 1 the store failed or is unreachable, or the entry is
locked by a transaction; 2 usage error; 3 no such entry; 4 rm not confirmed;
5 rm removed nothing: the entry changed since it was shown.
`

// Exit statuses.
const (
	exitFailed       = 1 // the store failed or is unreachable, or the entry is locked
	exitUsage        = 2 // bad flags, no store or two, no KEY or a bad one
	exitNotFound     = 3 // no such entry
	exitNotConfirmed = 4 // rm was not confirmed
	exitChanged      = 5 // rm: the entry changed since it was shown, and was not removed
)

// Environment variables that name the store when no flag does.
const (
	envRedisAddr    = "IDEM_REDIS_ADDR"
	envRedisCluster = "IDEM_REDIS_CLUSTER"
	envPGDSN        = "IDEM_PG_DSN"
	envMySQLDSN     = "IDEM_MYSQL_DSN"
	envDynamoDB     = "IDEM_DYNAMODB_TABLE"
)

// envScope stands in for -scope when it is not given: a scope that is a
// bearer token stays out of ps and the shell's history.
const envScope = "IDEMCTL_SCOPE"

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// failure is an error that ends idemctl with an exit status of its own.
type failure struct {
	code int
	msg  string
}

func (f *failure) Error() string { return f.msg }

// usageError is a failure with exit status 2.
func usageError(format string, args ...any) error {
	return &failure{exitUsage, fmt.Sprintf(format, args...)}
}

// run runs idemctl with the arguments args (without the program's name)
// and returns its exit status.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	c := &cli{stdin: stdin, stdout: stdout, stderr: stderr}
	err := c.run(ctx, args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, help)
		return 0
	}
	if err == nil {
		return 0
	}
	msg, code := err.Error(), exitFailed
	var f *failure
	if errors.As(err, &f) {
		code = f.code
	}
	fmt.Fprintln(stderr, "idemctl: "+c.scrub(msg))
	if code == exitUsage {
		fmt.Fprintln(stderr, "run 'idemctl -h' for help")
	}
	return code
}

// cli is one run of idemctl.
type cli struct {
	stdin          io.Reader
	stdinBuf       *bufio.Reader // stdin, buffered: see in
	stdout, stderr io.Writer

	// answers is set when the command reads an answer from stdin (rm
	// without -yes), which -scope - then cannot.
	answers bool

	globals
	given map[string]bool // the global flags given, by name
	store storage.Inspector

	// parent is run's context, and deadline the end of the -timeout
	// that bounds the command.
	parent   context.Context
	deadline time.Time

	// secrets are never printed: the DSN or URL, and its password.
	secrets []string
}

// globals are the global flags.
type globals struct {
	redis, redisURL, redisCluster, prefix string
	pg, mysql, table                      string
	dynamodb, region, endpoint            string
	json                                  bool
	timeout                               time.Duration
}

// command is one of idemctl's commands, run with the arguments after its
// name.
type command func(c *cli, ctx context.Context, args []string) error

// commands are idemctl's commands by name.
var commands = map[string]command{
	"inspect": (*cli).inspect,
	"ls":      (*cli).ls,
	"rm":      (*cli).rm,
	"stats":   (*cli).stats,
}

// run parses the global flags and runs the command they are followed by.
func (c *cli) run(ctx context.Context, args []string) error {
	g := &c.globals
	fs := newFlagSet("idemctl")
	fs.StringVar(&g.redis, "redis", "", "")
	fs.StringVar(&g.redisURL, "redis-url", "", "")
	fs.StringVar(&g.redisCluster, "redis-cluster", "", "")
	fs.StringVar(&g.prefix, "prefix", redisstore.DefaultPrefix, "")
	fs.StringVar(&g.pg, "pg", "", "")
	fs.StringVar(&g.mysql, "mysql", "", "")
	fs.StringVar(&g.table, "table", pgstore.DefaultTable, "")
	fs.StringVar(&g.dynamodb, "dynamodb", "", "")
	fs.StringVar(&g.region, "region", "", "")
	fs.StringVar(&g.endpoint, "endpoint", "", "")
	fs.BoolVar(&g.json, "json", false, "")
	fs.DurationVar(&g.timeout, "timeout", 30*time.Second, "")
	printVersion := fs.Bool("version", false, "")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *printVersion {
		fmt.Fprintln(c.stdout, buildinfo.Line("idemctl", version))
		return nil
	}
	if fs.NArg() == 0 {
		return usageError("no command: inspect, ls, rm or stats")
	}
	name, args := fs.Arg(0), fs.Args()[1:]
	if name == "help" {
		return flag.ErrHelp
	}
	cmd, ok := commands[name]
	if !ok {
		return usageError("unknown command %q: inspect, ls, rm or stats", name)
	}
	if g.timeout <= 0 {
		return usageError("-timeout must be positive")
	}
	c.given = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { c.given[f.Name] = true })
	// The command checks its flags before it opens the store.
	c.parent, c.deadline = ctx, time.Now().Add(g.timeout)
	ctx, cancel := context.WithDeadline(ctx, c.deadline)
	defer cancel()
	return cmd(c, ctx, args)
}

// chooseStore checks that g names exactly one store, by flags, or else by
// the environment; set holds the names of the global flags given.
func (g *globals) chooseStore(set map[string]bool) error {
	given := "given"
	if !set["redis"] && !set["redis-url"] && !set["redis-cluster"] && !set["pg"] && !set["mysql"] && !set["dynamodb"] {
		g.redis, g.redisCluster, g.pg, g.mysql = os.Getenv(envRedisAddr), os.Getenv(envRedisCluster), os.Getenv(envPGDSN), os.Getenv(envMySQLDSN)
		g.dynamodb = os.Getenv(envDynamoDB)
		given = "set in the environment"
	}
	var named []string
	for _, s := range []struct{ name, value string }{
		{"-redis (" + envRedisAddr + ")", g.redis},
		{"-redis-url", g.redisURL},
		{"-redis-cluster (" + envRedisCluster + ")", g.redisCluster},
		{"-pg (" + envPGDSN + ")", g.pg},
		{"-mysql (" + envMySQLDSN + ")", g.mysql},
		{"-dynamodb (" + envDynamoDB + ")", g.dynamodb},
	} {
		if s.value != "" {
			named = append(named, s.name)
		}
	}
	switch {
	case len(named) == 0:
		return usageError("no store: give -redis, -redis-url, -redis-cluster, -pg, -mysql or -dynamodb, or set %s, %s, %s, %s or %s",
			envRedisAddr, envRedisCluster, envPGDSN, envMySQLDSN, envDynamoDB)
	case len(named) > 1:
		return usageError("one store at a time; %s: %s", given, strings.Join(named, ", "))
	case g.pg != "" && set["prefix"]:
		return usageError("-prefix is for a Redis store; a PostgreSQL store has a -table")
	case g.mysql != "" && set["prefix"]:
		return usageError("-prefix is for a Redis store; a MySQL store has a -table")
	case g.dynamodb != "" && set["prefix"]:
		return usageError("-prefix is for a Redis store; a DynamoDB store's table is -dynamodb's")
	case g.dynamodb != "" && set["table"]:
		return usageError("-table is for a PostgreSQL or MySQL store; a DynamoDB store's table is -dynamodb's")
	case g.pg == "" && g.mysql == "" && set["table"]:
		return usageError("-table is for a PostgreSQL or MySQL store; a Redis store has a -prefix")
	case g.dynamodb == "" && (set["region"] || set["endpoint"]):
		return usageError("-region and -endpoint are for a DynamoDB store (-dynamodb TABLE)")
	case g.dynamodb != "":
		return checkDynamoDB(g.dynamodb, g.endpoint)
	}
	return nil
}

// newFlagSet returns a flag set that reports its errors to its caller,
// printing nothing.
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// parse parses args with fs: flag.ErrHelp for -h, a usage error for a bad
// flag.
func parse(fs *flag.FlagSet, args []string) error {
	return parseErr(fs, fs.Parse(args))
}

// parseErr is parse's answer for err, fs.Parse's.
func parseErr(fs *flag.FlagSet, err error) error {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return err
	case fs.Name() == "idemctl":
		return usageError("%v", err)
	}
	return usageError("%s: %v", fs.Name(), err)
}

// storeError is the failure for err, an error of the store.
func (c *cli) storeError(err error) error {
	switch {
	case errors.Is(err, storage.ErrNotFound):
		return &failure{exitNotFound, "no such entry (never created, expired, or removed)"}
	case errors.Is(err, pgstore.ErrLocked), errors.Is(err, sqlstore.ErrLocked):
		return &failure{exitFailed, "the entry is locked by a transaction under way (a handler's Fence): nothing was removed; try again"}
	case errors.Is(err, context.DeadlineExceeded):
		return &failure{exitFailed, fmt.Sprintf("%v (the -timeout of %v ran out)", err, c.timeout)}
	}
	return &failure{exitFailed, err.Error()}
}

// scrub returns msg with the secrets masked.
func (c *cli) scrub(msg string) string {
	for _, s := range c.secrets {
		if s != "" {
			msg = strings.ReplaceAll(msg, s, "xxxxx")
		}
	}
	return msg
}
