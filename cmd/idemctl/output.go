package main

import (
	"cmp"
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
	if err := tw.Flush(); err != nil {
		return err
	}
	if !withBody || r == nil || len(r.Body) == 0 {
		return nil
	}
	body := append([]byte("\n"), r.Body...)
	if body[len(body)-1] != '\n' {
		body = append(body, '\n')
	}
	_, err := w.Write(body)
	return err
}

// printListing writes ls's table to standard output, and a last line
// when there were more entries than limit.
func (c *cli) printListing(l listing, limit int) error {
	if len(l.Entries) == 0 {
		_, err := fmt.Fprintln(c.stdout, "no entries")
		return err
	}
	now := time.Now()
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tSTATE\tAGE\tLEASE-LEFT\tEXPIRES-IN\tSIZE")
	for _, e := range l.Entries {
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", printable(e.Key), e.State, age, lease, expiresIn(e, now), size)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if !l.More {
		return nil
	}
	_, err := fmt.Fprintf(c.stdout, "more entries than -limit %d: raise it, or narrow the listing with a state or -older-than\n", limit)
	return err
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
