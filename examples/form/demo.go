package main

// This file is the demo that -demo runs: a scripted browser that submits
// the shop's form as a shopper does, double click included, and checks
// every page against what the kit promises.

import (
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"sync"
)

// browser is a scripted browser: a cookie jar (its session) and a client.
type browser struct {
	base   string
	client *http.Client
}

// newBrowser returns a browser with a session of its own at base.
func newBrowser(base string) *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{base: base, client: &http.Client{Jar: jar}}
}

// page is what the browser got.
type page struct {
	status   int
	replayed bool
	body     string
}

func (p page) String() string {
	s := fmt.Sprintf("HTTP %d", p.status)
	if p.replayed {
		s += "  Idempotent-Replayed: true"
	}
	return s + "\n" + p.body
}

// get loads the page at path.
func (b *browser) get(path string) (page, error) {
	res, err := b.client.Get(b.base + path)
	return read(res, err)
}

// submit posts the order form with key.
func (b *browser) submit(key string) (page, error) {
	form := url.Values{keyField: {key}, "item": {"book"}, "qty": {"2"}}
	res, err := b.client.PostForm(b.base+"/orders", form)
	return read(res, err)
}

// read returns the page of a response, or err.
func read(res *http.Response, err error) (page, error) {
	if err != nil {
		return page{}, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	return page{status: res.StatusCode, replayed: res.Header.Get("Idempotent-Replayed") == "true", body: string(body)}, err
}

// browse plays a shopper against the shop at base and writes what it sees
// to out: it returns an error when a page is not the one the kit promises.
func browse(out io.Writer, base string) error {
	var failed []string
	check := func(ok bool, format string, args ...any) {
		if !ok {
			failed = append(failed, fmt.Sprintf(format, args...))
		}
	}
	show := func(title string, p page) { fmt.Fprintf(out, "# %s\n%s\n", title, p) }

	shopper := newBrowser(base)
	form, err := shopper.get("/")
	if err != nil {
		return err
	}
	key := keyIn(form.body)
	check(form.status == 200 && key != "", "the form: %v", form)
	fmt.Fprintf(out, "# the form, with a key issued to this session\nHTTP %d, hidden %s=%s\n\n", form.status, keyField, key)

	// A double click: two submits of the same form at once.
	var pages [2]page
	var errs [2]error
	var wg sync.WaitGroup
	for i := range pages {
		wg.Go(func() { pages[i], errs[i] = shopper.submit(key) })
	}
	wg.Wait()
	for i := range pages {
		if errs[i] != nil {
			return errs[i]
		}
		show(fmt.Sprintf("double click, submit %d", i+1), pages[i])
		check(pages[i].status == 200 && pages[i].body == pages[0].body, "submit %d: %v", i+1, pages[i])
	}
	check(pages[0].replayed != pages[1].replayed, "one submit ran, the other was replayed: %v / %v", pages[0], pages[1])
	first := pages[0].body
	check(strings.Contains(first, "Order 1: 2 x book"), "the order: %q", first)

	// Back, and submit again: the same page, no second order.
	again, err := shopper.submit(key)
	if err != nil {
		return err
	}
	show("Back and submit again", again)
	check(again.status == 200 && again.replayed && again.body == first, "resubmit: %v", again)

	// Another session sends this session's key; a made-up key.
	other, err := newBrowser(base).submit(key)
	if err != nil {
		return err
	}
	show("another session sends the same key", other)
	check(other.status == 400 && strings.Contains(other.body, "reload"), "other session: %v", other)
	forged, err := shopper.submit("MADEUPKEY234567ABCDEFGHIJK")
	if err != nil {
		return err
	}
	show("a key the shop never issued", forged)
	check(forged.status == 400, "forged key: %v", forged)

	// A new form is a new order.
	form, err = shopper.get("/")
	if err != nil {
		return err
	}
	next, err := shopper.submit(keyIn(form.body))
	if err != nil {
		return err
	}
	show("a new form (a new key): a new order", next)
	check(next.status == 200 && !next.replayed && strings.Contains(next.body, "Order 2: 2 x book"), "second order: %v", next)

	if failed != nil {
		return fmt.Errorf("the shop did not keep its promise:\n  %s", strings.Join(failed, "\n  "))
	}
	fmt.Fprintln(out, "2 orders placed for 5 submits: each form's order once.")
	return nil
}

// keyIn returns the hidden key of a rendered form.
func keyIn(page string) string {
	_, rest, ok := strings.Cut(page, `name="`+keyField+`" value="`)
	if !ok {
		return ""
	}
	key, _, _ := strings.Cut(rest, `"`)
	return key
}
