// Command form is an order form protected by server-issued one-time keys:
// the server puts a key in the form it renders, the first submit takes
// it, and a double submit (a double click, or Back and submit again) shows
// the first submit's result page instead of placing a second order.
//
//	go run ./examples/form                    # serve on localhost:8080, memory store; open http://localhost:8080/
//	go run ./examples/form -redis localhost:6379
//	go run ./examples/form -demo              # run a scripted browser against it, then exit
//
//	GET  /         -> the form, with a hidden idempotency_key issued for this session
//	POST /orders   -> the result page: "Order 1: 2 x book"
//
// This is the synchronizer-token technique (a one-time token per form),
// with idem's answer to the second submit: usually the second submit gets
// an error page ("this form was already sent"); here it gets the first's
// result page, byte for byte, and the order is placed once.
//
// The key is bound to the session (the middleware's scope is the session
// cookie, WithScope): a key from another session, a made-up key, or one
// left unused for longer than the issue's TTL (30 minutes here) gets 400
// ErrKeyNotIssued, rendered by the error writer as a page that asks to
// reload the form. A submit that fails (a 5xx) gives the key back, so the
// same form can be sent again. The form carries the key in a hidden field,
// since a browser cannot set a header on a form's submission: the
// middleware reads it with WithKey(idem.KeyFromForm("idempotency_key")).
package main

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"html/template"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/memstore"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/redis/go-redis/v9"
)

// sessionCookie names the session; its value is the middleware's scope.
const sessionCookie = "sid"

// keyField is the form's hidden field that carries the issued key.
const keyField = "idempotency_key"

func main() {
	log.SetFlags(0)
	addr := flag.String("addr", "localhost:8080", "listen address")
	redisAddr := flag.String("redis", "", "Redis address (host:port); default: the in-memory store")
	demoRun := flag.Bool("demo", false, "serve on a free port, run a scripted browser against it, and exit")
	flag.Parse()
	if err := run(*addr, *redisAddr, *demoRun, os.Stdout, os.Stderr); err != nil {
		log.Fatal(err)
	}
}

// run serves the shop on addr (or, with demoRun, on a free port while the
// scripted browser runs against it, writing its transcript to out). log
// gets the middleware's decisions.
func run(addr, redisAddr string, demoRun bool, out, logTo io.Writer) error {
	var store storage.Store
	if redisAddr == "" {
		ms := memstore.New()
		defer ms.Close() // 3. the store, last
		store = ms
	} else {
		rdb := redis.NewClient(redisstore.ClientOptions(redisAddr))
		defer rdb.Close()
		store = redisstore.New(rdb)
	}
	s, err := newShop(store, logTo)
	if err != nil {
		return err
	}
	if demoRun {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: s.routes(), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	var failed error
	if demoRun {
		failed = browse(out, "http://"+ln.Addr().String())
	} else {
		log.Printf("listening on http://%s; open it and submit the form twice", ln.Addr())
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		<-ctx.Done()
		stop()
	}
	// 1. the server: no new request, the handlers return; 2. idem: every
	// record stored; 3. the store (deferred).
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return errors.Join(failed, srv.Shutdown(ctx), s.m.Shutdown(ctx))
}

// shop is the application: a form and the endpoint it posts to.
type shop struct {
	m      *idem.Middleware
	orders atomic.Int64
	log    *log.Logger
}

// newShop returns the shop on store, logging idem's decisions to logTo.
func newShop(store storage.Store, logTo io.Writer) (*shop, error) {
	s := &shop{log: log.New(logTo, "idem: ", 0)}
	m, err := idem.New(store,
		idem.WithIssuedKeys(30*time.Minute),      // only keys this server issued, usable for 30 minutes
		idem.WithKey(idem.KeyFromForm(keyField)), // read from the form's hidden field
		idem.WithScope(session),                  // bound to the session
		idem.WithWait(5*time.Second),             // a double click waits for the first submit's page
		idem.WithErrorWriter(errorPage),          // refusals as pages, not problem+json
		idem.WithObserver(func(ev idem.Event) { s.log.Printf("%s %s: %s %d", ev.Method, ev.Route, ev.Outcome, ev.Status) }),
	)
	if err != nil {
		return nil, err
	}
	s.m = m
	return s, nil
}

// routes returns the shop's handler: the form, and the order endpoint
// behind idem.
func (s *shop) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", s.form)
	mux.Handle("POST /orders", nethttp.Middleware(s.m)(http.HandlerFunc(s.order)))
	return mux
}

// session returns the request's session id: the middleware's scope.
func session(r *http.Request) string {
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return ""
	}
	return c.Value
}

var formPage = template.Must(template.New("form").Parse(`<!doctype html>
<title>Order</title>
<form method="post" action="/orders">
<input type="hidden" name="` + keyField + `" value="{{.}}">
<label>Item <input name="item" value="book"></label>
<label>Quantity <input name="qty" value="2"></label>
<button>Place order</button>
</form>
`))

// form renders the order form with a key issued for the session, starting
// a session first if the browser has none.
func (s *shop) form(w http.ResponseWriter, r *http.Request) {
	if session(r) == "" {
		c := &http.Cookie{Name: sessionCookie, Value: rand.Text(), Path: "/", HttpOnly: true, SameSite: http.SameSiteLaxMode}
		http.SetCookie(w, c)
		r = r.Clone(r.Context())
		r.AddCookie(c) // the key is issued to the session just started
	}
	key, err := s.m.IssueKey(r)
	if err != nil {
		s.log.Printf("issuing a key: %v", err)
		http.Error(w, "The shop is unavailable; try again in a moment.", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store") // Back must not show a stale key
	formPage.Execute(w, key)
}

var resultPage = template.Must(template.New("result").Parse(`<!doctype html>
<title>Order {{.N}}</title>
<p>Order {{.N}}: {{.Qty}} x {{.Item}}. Thank you.</p>
`))

// order places the order once per issued key.
func (s *shop) order(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		http.Error(w, "bad form", http.StatusBadRequest)
		return
	}
	n := s.orders.Add(1)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	resultPage.Execute(w, struct {
		N         int64
		Item, Qty string
	}{n, r.PostForm.Get("item"), r.PostForm.Get("qty")})
}

// errorPage renders idem's refusals as pages: an unknown or expired key
// asks to reload the form.
func errorPage(w http.ResponseWriter, r *http.Request, e *idem.Error) {
	msg := e.Detail
	if errors.Is(e, idem.ErrKeyNotIssued) || errors.Is(e, idem.ErrMissingKey) {
		msg = "This form has expired or was not sent by this shop. Please reload the order form."
	}
	if e.RetryAfter > 0 {
		w.Header().Set("Retry-After", fmt.Sprint(int(e.RetryAfter.Seconds()+0.999)))
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(e.Status)
	fmt.Fprintf(w, "<!doctype html>\n<title>%s</title>\n<p>%s</p>\n", template.HTMLEscapeString(e.Title), template.HTMLEscapeString(msg))
}
