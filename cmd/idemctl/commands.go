package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemadmin"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/pgstore"
	"github.com/idemkit/idem/storage/sqlstore"
)

// keyFlags are the flags that name an entry by the key its client sent,
// as the middleware derives its storage key.
type keyFlags struct {
	scope, method, route, op string
	issued                   bool
}

// add defines the flags in fs.
func (k *keyFlags) add(fs *flag.FlagSet) {
	fs.StringVar(&k.scope, "scope", "", "")
	fs.StringVar(&k.method, "method", "", "")
	fs.StringVar(&k.route, "route", "", "")
	fs.StringVar(&k.op, "op", "", "")
	fs.BoolVar(&k.issued, "issued", false, "")
}

// storageKey returns the storage key that the KEY argument of fs names,
// with the key flags.
func (c *cli) storageKey(k *keyFlags, fs *flag.FlagSet) (string, error) {
	switch {
	case fs.NArg() == 0 || fs.Arg(0) == "":
		return "", usageError("%s: no KEY", fs.Name())
	case fs.NArg() > 1:
		return "", usageError("%s: one KEY, after the flags; got %q", fs.Name(), fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	key := fs.Arg(0)
	var q map[string][]string
	switch {
	case k.issued && (set["op"] || set["method"] || set["route"]):
		return "", usageError("%s: -issued takes -scope only", fs.Name())
	case set["op"] && (set["method"] || set["route"]):
		return "", usageError("%s: -op names Middleware.Do's key: no -method or -route (-scope for a call WithCallScope)", fs.Name())
	case set["op"]:
		if set["scope"] && k.scope == "-" {
			return "", usageError("%s: -op takes its -scope on the command line: it names the call's scope (WithCallScope), not a credential", fs.Name())
		}
		q = map[string][]string{"client_key": {key}, "op": {k.op}, "scope": {k.scope}}
	case k.issued, set["scope"] || set["method"] || set["route"]:
		scope, err := c.scope(k, set["scope"])
		if err != nil {
			return "", err
		}
		if k.issued {
			q = map[string][]string{"issued_key": {key}, "scope": {scope}}
		} else {
			q = map[string][]string{"client_key": {key}, "scope": {scope}, "method": {k.method}, "route": {k.route}}
		}
	default:
		q = map[string][]string{"key": {key}}
	}
	skey, err := idemadmin.KeyFromQuery(q)
	switch {
	case errors.Is(err, idem.ErrInvalidKey):
		msg := strings.Replace(strings.TrimPrefix(err.Error(), "idemadmin: client_key: "), "idemadmin: issued_key: ", "", 1)
		msg = strings.Replace(msg, "idem: ", "", 1)
		return "", usageError("%s: KEY is not a key the middleware accepts (it answers 400 to it, so no entry has it): %s", fs.Name(), msg)
	case err != nil:
		return "", usageError("%s: a request's key takes -method and -route (and -scope, unless it is empty); Do's, -op; an issued key, -issued -scope", fs.Name())
	}
	return skey, nil
}

// scope returns the scope of a request's or an issued key: -scope's
// value (given says whether it was given), one line of standard input for
// -scope -, or else $IDEMCTL_SCOPE.
func (c *cli) scope(k *keyFlags, given bool) (string, error) {
	switch {
	case !given:
		return os.Getenv(envScope), nil
	case k.scope != "-":
		return k.scope, nil
	case c.answers:
		return "", usageError("rm reads its answer from standard input, so it cannot read -scope - there too: set %s instead (or give -yes)", envScope)
	}
	line, err := c.in().ReadString('\n')
	if err != nil && (err != io.EOF || line == "") {
		return "", usageError("-scope -: no line on standard input (%v)", err)
	}
	return strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r"), nil
}

// in returns standard input, buffered once for all its readers.
func (c *cli) in() *bufio.Reader {
	if c.stdinBuf == nil {
		c.stdinBuf = bufio.NewReader(c.stdin)
	}
	return c.stdinBuf
}

// parseArgs parses args with fs, as parse does, but takes a last argument
// that starts with "-" and is no flag of fs as KEY, as if it followed
// "--": a storage key may start with "-".
func parseArgs(fs *flag.FlagSet, args []string) error {
	err := fs.Parse(args)
	if err == nil || len(args) == 0 || errors.Is(err, flag.ErrHelp) {
		return parseErr(fs, err)
	}
	last := args[len(args)-1]
	name := strings.TrimPrefix(strings.TrimPrefix(last, "-"), "-")
	if strings.HasPrefix(last, "-") && !strings.Contains(name, "=") && fs.Lookup(name) == nil &&
		err.Error() == "flag provided but not defined: -"+name && !slices.Contains(args, "--") {
		again := append(slices.Clone(args[:len(args)-1]), "--", last)
		return parseErr(fs, fs.Parse(again))
	}
	return parseErr(fs, err)
}

// inspect shows one entry.
func (c *cli) inspect(ctx context.Context, args []string) error {
	var k keyFlags
	fs := newFlagSet("inspect")
	body := fs.Bool("body", false, "")
	k.add(fs)
	if err := parseArgs(fs, args); err != nil {
		return err
	}
	key, err := c.storageKey(&k, fs)
	if err != nil {
		return err
	}
	closeStore, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	e, err := idemadmin.Lookup(ctx, c.store, key, *body)
	if err != nil && !errors.Is(err, idemadmin.ErrCorrupt) {
		return c.storeError(err)
	}
	if err := c.printEntry(e, *body); err != nil {
		return err
	}
	return err // ErrCorrupt: shown without its response
}

// stateFlags are the flags of ls and rm that select the entries of one
// state.
type stateFlags [4]struct {
	flag  string
	state storage.State
	set   *bool
}

// add defines the flags in fs; -issued only when issued is set (rm's
// -issued names an issued KEY).
func (s *stateFlags) add(fs *flag.FlagSet, issued bool) {
	*s = stateFlags{
		{flag: "in-flight", state: storage.InFlight},
		{flag: "done", state: storage.Done},
		{flag: "committed", state: storage.Committed},
		{flag: "issued", state: storage.Issued},
	}
	for i := range s {
		if s[i].state != storage.Issued || issued {
			s[i].set = fs.Bool(s[i].flag, false, "")
		} else {
			s[i].set = new(bool)
		}
	}
}

// chosen returns the state the flags chose (0: none) and the flags given.
func (s *stateFlags) chosen() (storage.State, []string) {
	var state storage.State
	var given []string
	for _, f := range s {
		if *f.set {
			state = f.state
			given = append(given, "-"+f.flag)
		}
	}
	return state, given
}

// ls lists entries.
func (c *cli) ls(ctx context.Context, args []string) error {
	fs := newFlagSet("ls")
	var states stateFlags
	states.add(fs, true)
	olderThan := fs.Duration("older-than", 0, "")
	limit := fs.Int("limit", 100, "")
	cursor := fs.String("cursor", "", "")
	all := fs.Bool("all", false, "")
	if err := parse(fs, args); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	state, chosen := states.chosen()
	q := storage.Query{State: state, MinAge: *olderThan, Cursor: *cursor}
	switch {
	case fs.NArg() > 0:
		return usageError("ls: takes no arguments; got %q", fs.Args())
	case len(chosen) > 1:
		return usageError("ls: one state at most; got %s", strings.Join(chosen, " "))
	case *olderThan < 0:
		return usageError("ls: -older-than must not be negative")
	case *limit < 1:
		return usageError("ls: -limit must be at least 1")
	case *all && set["limit"]:
		return usageError("ls: -all prints every entry: no -limit")
	case set["cursor"] && *cursor == "":
		return usageError("ls: -cursor takes the cursor that a page printed")
	}
	closeStore, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	if *all {
		return c.lsAll(ctx, q)
	}

	// Pages of at most the entries left to print, so that the cursor of
	// the last one goes on exactly after them. A Redis listing may show
	// an entry twice.
	var found []storage.Entry
	seen := map[string]bool{}
	for {
		q.Limit = min(*limit-len(found), storage.MaxListLimit)
		page, err := c.store.List(ctx, q)
		if err != nil {
			return c.listError(err)
		}
		for _, e := range page.Entries {
			if !seen[e.Key] {
				seen[e.Key] = true
				found = append(found, e)
			}
		}
		q.Cursor = page.Next
		if page.Next == "" || len(found) >= *limit {
			break
		}
	}
	sortOldestFirst(found)
	out := listing{Entries: []idemadmin.Entry{}, More: q.Cursor != "", Next: q.Cursor}
	now := time.Now()
	for _, e := range found {
		out.Entries = append(out.Entries, idemadmin.View(e, now))
	}
	if c.json {
		return c.printJSON(out)
	}
	next := ""
	if q.Cursor != "" {
		next = c.lsCommand(state, *olderThan, set["older-than"], *limit, q.Cursor)
	}
	return c.printListing(out, next)
}

// listError is the failure for err, an error of List: a usage error for
// a cursor the store did not make.
func (c *cli) listError(err error) error {
	if errors.Is(err, storage.ErrInvalid) {
		return usageError("ls: %v (a -cursor goes with the listing it was printed by: the same state and -older-than)", err)
	}
	return c.storeError(err)
}

// lsCommand returns the ls command that prints the page after cursor.
func (c *cli) lsCommand(state storage.State, olderThan time.Duration, olderThanSet bool, limit int, cursor string) string {
	cmd := "idemctl"
	for _, name := range []string{"json"} {
		if c.given[name] {
			cmd += " -" + name
		}
	}
	cmd += " [store flags] ls"
	if state != 0 {
		cmd += " -" + strings.ReplaceAll(idemadmin.StateName(state), "_", "-")
	}
	if olderThanSet {
		cmd += " -older-than " + olderThan.String()
	}
	if limit != 100 {
		cmd += " -limit " + strconv.Itoa(limit)
	}
	return cmd + " -cursor " + shellQuote(cursor)
}

// lsAll prints every entry that q selects, page after page, as it reads
// them: its memory does not grow with the store.
func (c *cli) lsAll(ctx context.Context, q storage.Query) error {
	q.Limit = storage.MaxListLimit
	p := c.newListPrinter()
	for {
		page, err := c.store.List(ctx, q)
		if err != nil {
			return c.listError(err)
		}
		sortOldestFirst(page.Entries)
		now := time.Now()
		views := make([]idemadmin.Entry, 0, len(page.Entries))
		for _, e := range page.Entries {
			views = append(views, idemadmin.View(e, now))
		}
		if err := p.page(views); err != nil {
			return err
		}
		if page.Next == "" {
			return p.end()
		}
		q.Cursor = page.Next
	}
}

// sortOldestFirst sorts entries oldest first, those whose Since is
// unknown before all.
func sortOldestFirst(entries []storage.Entry) {
	slices.SortFunc(entries, func(a, b storage.Entry) int {
		return cmp.Or(a.Since.Compare(b.Since), strings.Compare(a.Key, b.Key))
	})
}

// listing is what ls prints: the entries, oldest first, whether the
// listing goes on, and the cursor it goes on with (ls -cursor).
type listing struct {
	Entries []idemadmin.Entry `json:"entries"`
	More    bool              `json:"more"`
	Next    string            `json:"next,omitempty"`
}

// rm removes an entry, or the entries of a state.
func (c *cli) rm(ctx context.Context, args []string) error {
	var k keyFlags
	var states stateFlags
	fs := newFlagSet("rm")
	yes := fs.Bool("yes", false, "")
	dryRun := fs.Bool("dry-run", false, "")
	olderThan := fs.Duration("older-than", 0, "")
	states.add(fs, false)
	k.add(fs)
	if err := parseArgs(fs, args); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	state, chosen := states.chosen()
	if len(chosen) > 0 || set["older-than"] || set["dry-run"] {
		switch {
		case fs.NArg() > 0:
			return usageError("rm: a KEY, or a state and -older-than to remove many: not both; got %q", fs.Args())
		case set["scope"] || set["method"] || set["route"] || set["op"] || set["issued"]:
			return usageError("rm: the key flags name one KEY: no -scope, -method, -route, -op or -issued with a state")
		case len(chosen) != 1:
			return usageError("rm: to remove many entries, give one state (-in-flight, -done or -committed) and -older-than (0s for every age)")
		case !set["older-than"]:
			return usageError("rm: to remove many entries, give -older-than too (0s for every age): rm %s -older-than 10m", chosen[0])
		case *olderThan < 0:
			return usageError("rm: -older-than must not be negative")
		}
		c.answers = !*yes && !*dryRun
		return c.rmMany(ctx, storage.Query{State: state, MinAge: *olderThan}, *yes, *dryRun)
	}
	c.answers = !*yes
	key, err := c.storageKey(&k, fs)
	if err != nil {
		return err
	}
	closeStore, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	shown, err := idemadmin.Lookup(ctx, c.store, key, false)
	if err != nil && !errors.Is(err, idemadmin.ErrCorrupt) {
		return c.storeError(err)
	}
	if !*yes {
		if err := writeEntry(c.stderr, shown, false); err != nil {
			return err
		}
	}
	warnRemoval(c.stderr, shown.State)
	if !*yes {
		ok, restore := c.ask("remove it? [y/N] ")
		if !ok {
			return &failure{exitNotConfirmed, "not removed"}
		}
		var cancel context.CancelFunc
		ctx, cancel = restore()
		defer cancel()
	}
	removed, err := c.store.Remove(ctx, key, shown.Version)
	if errors.Is(err, storage.ErrChanged) {
		now := idemadmin.View(removed, time.Now())
		if err := c.printEntry(now, false); err != nil {
			return err
		}
		return &failure{exitChanged, "not removed: the entry changed since it was shown: it is now " + describe(now) +
			"; run rm again to remove it as it is now"}
	}
	if err != nil {
		return c.storeError(err)
	}
	if err := c.printEntry(idemadmin.View(removed, time.Now()), false); err != nil || c.json {
		return err
	}
	_, err = fmt.Fprintln(c.stdout, "removed")
	return err
}

// ask asks question on standard error, and reports whether standard
// input answers y or yes. The -timeout does not run while the operator
// thinks: restore returns a context with the time that was left.
func (c *cli) ask(question string) (ok bool, restore func() (context.Context, context.CancelFunc)) {
	left := time.Until(c.deadline)
	fmt.Fprint(c.stderr, question)
	ok = confirmed(c.in())
	if !isTerminal(c.stdin) {
		fmt.Fprintln(c.stderr) // which a terminal echoes
	}
	return ok, func() (context.Context, context.CancelFunc) { return context.WithTimeout(c.parent, left) }
}

// warnRemoval warns on w of what removing an entry in state does, when
// it is in flight or committed.
func warnRemoval(w io.Writer, state string) {
	switch state {
	case "in_flight":
		fmt.Fprintln(w, "warning: this entry is in flight: its handler may still be running. Once it is removed, the next request with its key runs the handler again, even while this one still runs (and this one's response will not be stored).")
	case "committed":
		fmt.Fprintln(w, "warning: this entry is committed: the work ran (its transaction committed). Once it is removed, a retry with its key runs the work again.")
	}
}

// describe says what an entry is now, for a person.
func describe(e idemadmin.Entry) string {
	s := strings.ReplaceAll(e.State, "_", " ")
	if e.AgeMS != nil {
		s += " (for " + duration(*e.AgeMS) + ")"
	}
	return s + ", version " + e.Version
}

// rmMany removes the entries that q selects, each only if it is still as
// listed.
func (c *cli) rmMany(ctx context.Context, q storage.Query, yes, dryRun bool) error {
	closeStore, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	var found []storage.Entry
	seen := map[string]bool{}
	q.Limit = storage.MaxListLimit
	for {
		page, err := c.store.List(ctx, q)
		if err != nil {
			return c.storeError(err)
		}
		for _, e := range page.Entries {
			if !seen[e.Key] {
				seen[e.Key] = true
				found = append(found, e)
			}
		}
		if page.Next == "" {
			break
		}
		q.Cursor = page.Next
	}
	sortOldestFirst(found)
	l := listing{Entries: []idemadmin.Entry{}}
	now := time.Now()
	for _, e := range found {
		l.Entries = append(l.Entries, idemadmin.View(e, now))
	}
	if dryRun || len(found) == 0 {
		if c.json {
			return c.printJSON(l)
		}
		return writeListing(c.stdout, l, "")
	}
	if !yes {
		if err := writeListing(c.stderr, l, ""); err != nil {
			return err
		}
		warnRemoval(c.stderr, idemadmin.StateName(q.State))
		question := fmt.Sprintf("remove these %d entries? [y/N] ", len(found))
		if len(found) == 1 {
			question = "remove this entry? [y/N] "
		}
		ok, restore := c.ask(question)
		if !ok {
			return &failure{exitNotConfirmed, "none removed"}
		}
		var cancel context.CancelFunc
		ctx, cancel = restore()
		defer cancel()
	} else {
		warnRemoval(c.stderr, idemadmin.StateName(q.State))
	}

	var r removals
	r.Removed, r.Changed, r.Gone = []idemadmin.Entry{}, []idemadmin.Entry{}, []string{}
	var failed error
	for _, e := range found {
		got, err := c.store.Remove(ctx, e.Key, e.Version)
		now := time.Now()
		switch {
		case err == nil:
			r.Removed = append(r.Removed, idemadmin.View(got, now))
			c.textf("removed  %s\n", printable(e.Key))
		case errors.Is(err, storage.ErrChanged):
			v := idemadmin.View(got, now)
			r.Changed = append(r.Changed, v)
			c.textf("changed  %s: not removed: it is now %s\n", printable(e.Key), describe(v))
		case errors.Is(err, storage.ErrNotFound):
			r.Gone = append(r.Gone, e.Key)
			c.textf("gone     %s\n", printable(e.Key))
		case errors.Is(err, pgstore.ErrLocked), errors.Is(err, sqlstore.ErrLocked):
			r.Locked = append(r.Locked, e.Key)
			c.textf("locked   %s: not removed: a transaction under way holds it\n", printable(e.Key))
		default:
			failed = c.storeError(err)
		}
		if failed != nil {
			break
		}
	}
	if c.json {
		if err := c.printJSON(r); err != nil {
			return err
		}
	} else {
		c.textf("removed %d, changed %d, gone %d", len(r.Removed), len(r.Changed), len(r.Gone))
		if len(r.Locked) > 0 {
			c.textf(", locked %d", len(r.Locked))
		}
		c.textf(" (of %d listed)\n", len(found))
	}
	switch {
	case failed != nil:
		return failed
	case len(r.Locked) > 0:
		return &failure{exitFailed, fmt.Sprintf("%d entries locked by a transaction under way (a handler's Fence) were not removed: try again", len(r.Locked))}
	case len(r.Changed) > 0:
		return &failure{exitChanged, fmt.Sprintf("%d entries changed since they were listed, and were not removed", len(r.Changed))}
	}
	return nil
}

// removals is what rm of many entries did, in its JSON: the entries it
// removed, as they were; those that changed since they were listed, as
// they are now; the keys of those gone meanwhile, and of those locked.
type removals struct {
	Removed []idemadmin.Entry `json:"removed"`
	Changed []idemadmin.Entry `json:"changed"`
	Gone    []string          `json:"gone"`
	Locked  []string          `json:"locked,omitempty"`
}

// textf prints to standard output, without -json only.
func (c *cli) textf(format string, args ...any) {
	if !c.json {
		fmt.Fprintf(c.stdout, format, args...)
	}
}

// confirmed reads a line from r, and reports whether it says y or yes.
func confirmed(r *bufio.Reader) bool {
	line, _ := r.ReadString('\n')
	answer := strings.ToLower(strings.TrimSpace(line))
	return answer == "y" || answer == "yes"
}

// isTerminal reports whether r is a terminal.
func isTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// stats counts the entries by state.
func (c *cli) stats(ctx context.Context, args []string) error {
	fs := newFlagSet("stats")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError("stats: takes no arguments; got %q", fs.Args())
	}
	closeStore, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	s, err := idemadmin.Count(ctx, c.store)
	if err != nil {
		return c.storeError(err)
	}
	if c.json {
		return c.printJSON(s)
	}
	return c.printStats(s)
}
