package main

import (
	"cmp"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/idemkit/idem/idemadmin"
)

// printJSON writes v to standard output as indented JSON.
func (c *cli) printJSON(v any) error {
	enc := json.NewEncoder(c.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printEntry writes e to standard output: as JSON with -json, else as
// writeEntry does.
func (c *cli) printEntry(e idemadmin.Entry, withBody bool) error {
	if c.json {
		return c.printJSON(e)
	}
	return writeEntry(c.stdout, e, withBody)
}

// writeEntry writes e to w, one field per line, and with withBody its
// response's headers and trailers, and then, after a blank line, its body
// as stored (with a newline added when it ends without one).
func writeEntry(w io.Writer, e idemadmin.Entry, withBody bool) error {
	now := time.Now()
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	field := func(name, value string) { fmt.Fprintf(tw, "%s\t%s\n", name, value) }
	field("key", printable(e.Key))
	field("state", e.State)
	if e.Fingerprint != "" {
		field("fingerprint", e.Fingerprint)
	}
	if e.Since != nil {
		field("since", e.Since.Format(time.RFC3339)+" ("+duration(*e.AgeMS)+" ago)")
	} else {
		field("since", "unknown")
	}
	if leased(e) {
		field("lease left", duration(e.LeaseLeftMS))
	}
	field("expires in", expiresIn(e, now))
	if e.State == "done" {
		field("size", strconv.Itoa(e.Size)+" bytes")
	}
	r := e.Response
	if r != nil {
		if r.Status == 0 {
			field("status", "unknown (the connection was hijacked)")
		} else {
			field("status", strconv.Itoa(r.Status))
		}
		if r.NotReplayable {
			field("replayable", "no: the response was not kept, a retry gets 409")
		}
		field("content type", cmp.Or(printable(r.ContentType), "-"))
		field("body size", strconv.Itoa(r.BodySize)+" bytes")
		if withBody {
			for _, h := range []struct {
				name   string
				header map[string][]string
			}{{"header", r.Header}, {"trailer", r.Trailer}} {
				for _, name := range slices.Sorted(maps.Keys(h.header)) {
					for _, v := range h.header[name] {
						field(h.name, printable(name+": "+v))
					}
				}
			}
		}
	}
	binary := withBody && r != nil && r.BodyEncoding() == idemadmin.BodyBase64
	if binary {
		field("body encoding", "base64: not text of a textual content type")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if !withBody || r == nil || len(r.Body) == 0 {
		return nil
	}
	body := append([]byte("\n"), r.Body...)
	if binary {
		body = append([]byte("\n"), base64.StdEncoding.EncodeToString(r.Body)...)
	}
	if body[len(body)-1] != '\n' {
		body = append(body, '\n')
	}
	_, err := w.Write(body)
	return err
}

// printListing writes ls's table to standard output, and a last line
// with the command that goes on when the listing is not over.
func (c *cli) printListing(l listing, next string) error {
	return writeListing(c.stdout, l, next)
}

// writeListing writes l as a table to w, a hint when a key starts with
// "-", and, when next is not empty, a last line that says how to go on.
func writeListing(w io.Writer, l listing, next string) error {
	if len(l.Entries) == 0 && !l.More {
		_, err := fmt.Fprintln(w, "no entries")
		return err
	}
	p := &listPrinter{w: w, header: true}
	if err := p.page(l.Entries); err != nil {
		return err
	}
	if err := p.hint(); err != nil || next == "" {
		return err
	}
	more := "more entries"
	if len(l.Entries) == 0 {
		more = "none in this page of the store, more may follow"
	}
	_, err := fmt.Fprintf(w, "%s: %s\n", more, next)
	return err
}

// listPrinter prints ls's table, or with json its JSON, page after page.
type listPrinter struct {
	w      io.Writer
	json   bool
	wide   bool   // columns of a fixed least width, the same on every page
	header bool   // the header is still to print
	dashed string // a key that starts with "-", for the hint
	n      int    // entries printed
}

// newListPrinter returns the printer of ls -all.
func (c *cli) newListPrinter() *listPrinter {
	return &listPrinter{w: c.stdout, json: c.json, wide: true, header: true}
}

// page prints entries.
func (p *listPrinter) page(entries []idemadmin.Entry) error {
	if p.json {
		for _, e := range entries {
			b, err := json.MarshalIndent(e, "    ", "  ")
			if err != nil {
				return err
			}
			sep := ",\n    "
			if p.n == 0 {
				sep = "{\n  \"entries\": [\n    "
			}
			p.n++
			if _, err := fmt.Fprintf(p.w, "%s%s", sep, b); err != nil {
				return err
			}
		}
		return nil
	}
	if len(entries) == 0 {
		return nil
	}
	now := time.Now()
	minWidth := 0
	if p.wide {
		minWidth = 11
	}
	tw := tabwriter.NewWriter(p.w, minWidth, 0, 2, ' ', 0)
	if p.header {
		fmt.Fprintln(tw, "KEY\tSTATE\tAGE\tLEASE-LEFT\tEXPIRES-IN\tSIZE")
		p.header = false
	}
	for _, e := range entries {
		age, lease, size := "-", "-", "-"
		if e.AgeMS != nil {
			age = duration(*e.AgeMS)
		}
		if leased(e) {
			lease = duration(e.LeaseLeftMS)
		}
		if e.State == "done" {
			size = strconv.Itoa(e.Size)
		}
		if strings.HasPrefix(e.Key, "-") && p.dashed == "" {
			p.dashed = e.Key
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", printable(e.Key), e.State, age, lease, expiresIn(e, now), size)
		p.n++
	}
	return tw.Flush()
}

// end ends the listing of ls -all.
func (p *listPrinter) end() error {
	var err error
	switch {
	case p.json && p.n == 0:
		_, err = fmt.Fprint(p.w, "{\n  \"entries\": [],\n  \"more\": false\n}\n")
	case p.json:
		_, err = fmt.Fprint(p.w, "\n  ],\n  \"more\": false\n}\n")
	case p.n == 0:
		_, err = fmt.Fprintln(p.w, "no entries")
	default:
		err = p.hint()
	}
	return err
}

// hint says, when a key printed starts with "-", how to name it.
func (p *listPrinter) hint() error {
	if p.dashed == "" {
		return nil
	}
	_, err := fmt.Fprintf(p.w, "a KEY that starts with \"-\" follows \"--\": idemctl inspect -- %s\n", printable(p.dashed))
	return err
}

// shellQuote quotes s for a POSIX shell, when it needs it.
func shellQuote(s string) string {
	if s != "" && !strings.ContainsFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_.,:/=+@%", r))
	}) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// printStats writes the counts to standard output, and the oldest entry
// in flight.
func (c *cli) printStats(s idemadmin.Stats) error {
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	for _, state := range []string{"in_flight", "done", "committed", "issued"} {
		fmt.Fprintf(tw, "%s\t%d\n", state, s.Entries[state])
	}
	if e := s.OldestInFlight; e != nil {
		fmt.Fprintf(tw, "oldest in flight\t%s, %s ago\n", printable(e.Key), duration(*e.AgeMS))
	}
	return tw.Flush()
}

// leased reports whether e has a lease to show: in flight or committed.
func leased(e idemadmin.Entry) bool { return e.State == "in_flight" || e.State == "committed" }

// expiresIn says how long until the store forgets e.
func expiresIn(e idemadmin.Entry, now time.Time) string {
	if e.Expires.IsZero() {
		return "-"
	}
	return duration(max(e.Expires.Sub(now), 0).Milliseconds())
}

// duration writes ms milliseconds for a person: to the millisecond under
// a second, the tenth of a second under a minute, the second above.
func duration(ms int64) string {
	d := time.Duration(ms) * time.Millisecond
	switch {
	case d < time.Second:
		return d.String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// printable returns s, quoted when it holds a character that a terminal
// would not show as it is.
func printable(s string) string {
	if strings.ContainsFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) {
		return strconv.Quote(s)
	}
	return s
}
