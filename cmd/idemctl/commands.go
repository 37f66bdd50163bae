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
	"strings"
	"time"

	"github.com/idemkit/idem/idemadmin"
	"github.com/idemkit/idem/storage"
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
func (k *keyFlags) storageKey(fs *flag.FlagSet) (string, error) {
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
	case k.issued:
		q = map[string][]string{"issued_key": {key}, "scope": {k.scope}}
	case set["op"] && (set["method"] || set["route"]):
		return "", usageError("%s: -op names Middleware.Do's key: no -method or -route (-scope for a call WithCallScope)", fs.Name())
	case set["op"]:
		q = map[string][]string{"client_key": {key}, "op": {k.op}, "scope": {k.scope}}
	case set["scope"] || set["method"] || set["route"]:
		q = map[string][]string{"client_key": {key}, "scope": {k.scope}, "method": {k.method}, "route": {k.route}}
	default:
		q = map[string][]string{"key": {key}}
	}
	skey, err := idemadmin.KeyFromQuery(q)
	if err != nil {
		return "", usageError("%s: a request's key takes -method and -route (and -scope, unless it is empty); Do's, -op; an issued key, -issued -scope", fs.Name())
	}
	return skey, nil
}

// inspect shows one entry.
func (c *cli) inspect(ctx context.Context, args []string) error {
	var k keyFlags
	fs := newFlagSet("inspect")
	body := fs.Bool("body", false, "")
	k.add(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	key, err := k.storageKey(fs)
	if err != nil {
		return err
	}
	closeStore, err := c.open()
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

// ls lists entries.
func (c *cli) ls(ctx context.Context, args []string) error {
	fs := newFlagSet("ls")
	states := []struct {
		flag  string
		state storage.State
		set   *bool
	}{
		{flag: "in-flight", state: storage.InFlight},
		{flag: "done", state: storage.Done},
		{flag: "committed", state: storage.Committed},
		{flag: "issued", state: storage.Issued},
	}
	for i := range states {
		states[i].set = fs.Bool(states[i].flag, false, "")
	}
	olderThan := fs.Duration("older-than", 0, "")
	limit := fs.Int("limit", 100, "")
	if err := parse(fs, args); err != nil {
		return err
	}
	q := storage.Query{MinAge: *olderThan, Limit: storage.MaxListLimit}
	var chosen []string
	for _, s := range states {
		if *s.set {
			q.State = s.state
			chosen = append(chosen, "-"+s.flag)
		}
	}
	switch {
	case fs.NArg() > 0:
		return usageError("ls: takes no arguments; got %q", fs.Args())
	case len(chosen) > 1:
		return usageError("ls: one state at most; got %s", strings.Join(chosen, " "))
	case *olderThan < 0:
		return usageError("ls: -older-than must not be negative")
	case *limit < 1:
		return usageError("ls: -limit must be at least 1")
	}
	closeStore, err := c.open()
	if err != nil {
		return err
	}
	defer closeStore()

	// Until one entry more than the limit shows that there are more, or
	// the listing ends. A Redis listing may show an entry twice.
	var found []storage.Entry
	seen := map[string]bool{}
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
		if page.Next == "" || len(found) > *limit {
			break
		}
		q.Cursor = page.Next
	}
	// Oldest first, those whose Since is unknown before all.
	slices.SortFunc(found, func(a, b storage.Entry) int {
		return cmp.Or(a.Since.Compare(b.Since), strings.Compare(a.Key, b.Key))
	})
	out := listing{Entries: []idemadmin.Entry{}, More: len(found) > *limit}
	now := time.Now()
	for _, e := range found[:min(len(found), *limit)] {
		out.Entries = append(out.Entries, idemadmin.View(e, now))
	}
	if c.json {
		return c.printJSON(out)
	}
	return c.printListing(out, *limit)
}

// listing is what ls prints: the entries, oldest first, and whether there
// were more than -limit.
type listing struct {
	Entries []idemadmin.Entry `json:"entries"`
	More    bool              `json:"more"`
}

// rm removes an entry.
func (c *cli) rm(ctx context.Context, args []string) error {
	var k keyFlags
	fs := newFlagSet("rm")
	yes := fs.Bool("yes", false, "")
	k.add(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	key, err := k.storageKey(fs)
	if err != nil {
		return err
	}
	closeStore, err := c.open()
	if err != nil {
		return err
	}
	defer closeStore()
	if !*yes {
		e, err := idemadmin.Lookup(ctx, c.store, key, false)
		if err != nil && !errors.Is(err, idemadmin.ErrCorrupt) {
			return c.storeError(err)
		}
		if err := writeEntry(c.stderr, e, false); err != nil {
			return err
		}
		// The -timeout does not run while the operator thinks.
		left := time.Until(c.deadline)
		fmt.Fprint(c.stderr, "remove it? [y/N] ")
		ok := confirmed(c.stdin)
		if !isTerminal(c.stdin) {
			fmt.Fprintln(c.stderr) // which a terminal echoes
		}
		if !ok {
			return &failure{exitNotConfirmed, "not removed"}
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(c.parent, left)
		defer cancel()
	}
	removed, err := c.store.Remove(ctx, key)
	if err != nil {
		return c.storeError(err)
	}
	if err := c.printEntry(idemadmin.View(removed, time.Now()), false); err != nil || c.json {
		return err
	}
	_, err = fmt.Fprintln(c.stdout, "removed")
	return err
}

// confirmed reads a line from r, and reports whether it says y or yes.
func confirmed(r io.Reader) bool {
	line, _ := bufio.NewReader(r).ReadString('\n')
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
	closeStore, err := c.open()
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
