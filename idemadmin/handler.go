package idemadmin

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/storage"
)

// Option configures [Handler].
type Option func(*config)

type config struct {
	remove   bool
	onRemove func(r *http.Request, removed Entry)
}

// WithRemove lets the handler remove entries (DELETE /entry), and calls
// onRemove (when not nil) after each removal, with the request and the
// entry as it was: the place to log or audit who removed what. A DELETE
// that removed nothing (the entry changed since it was shown, or is gone)
// is not reported. Without WithRemove, DELETE /entry answers 405.
//
// A DELETE removes the entry only if it is still the one the operator
// saw: it takes version=, the entry's version as GET /entry or
// GET /entries shows it, and the store checks it and removes the entry in
// one step (storage.Inspector.Remove). An operator who saw an execution
// stuck in flight never removes the done record that its completion
// wrote meanwhile, which would make a retry run the work again.
func WithRemove(onRemove func(r *http.Request, removed Entry)) Option {
	return func(c *config) { c.remove, c.onRemove = true, onRemove }
}

// Handler serves store's entries as JSON, to operators: mount it behind
// the application's own authentication and authorization (it checks
// none), under a prefix of its own with http.StripPrefix:
//
//	mux.Handle("/admin/idem/", requireAdmin(http.StripPrefix("/admin/idem", idemadmin.Handler(store))))
//
// It serves, at its root:
//
//	GET    /entries  a page of entries, without responses: {"entries": [...], "next": cursor}
//	                 state=in_flight|done|committed|issued (default: all), min_age=30s,
//	                 cursor= (a page's next), limit= (default 100, at most 1000)
//	GET    /entry    one entry ([Entry]), its response's status, content type and size when done;
//	                 body=true adds its headers and body
//	DELETE /entry    version= (the entry's version, as GET shows it): removes the entry if it
//	                 is still that version, and answers it as it was (only WithRemove)
//	GET    /stats    the entries by state, and the oldest in flight ([Stats]): reads every entry
//
// /entry names the entry by its storage key (key=), or as the middleware
// derives it (see idem.StorageKey): client_key= with scope=, method= and
// route=; client_key= with op= for Middleware.Do (and scope= for a call
// WithCallScope); or issued_key= with
// scope= for a key issued under WithIssuedKeys. A scope is what the
// middleware's scope function returns (by default the principal that the
// application's authentication named with idem.ContextWithPrincipal).
//
// client_key= and issued_key= are read as the middleware reads the key
// header (idem.ParseKey): the RFC 8941 form "order-42" names the same
// entry as order-42, and a key the middleware refuses is a 400 here (see
// [KeyFromQuery]).
//
// A done entry's body (body=true) is a string in the JSON, as text or in
// base64, which "body_encoding" says ([Response.MarshalJSON]).
//
// Errors are RFC 9457 problems: 400 for a bad parameter (a client key the
// middleware refuses, a DELETE without version=), 404 when there is no
// such entry, 405 for DELETE without WithRemove, 409 for a DELETE of an
// entry that changed since it was shown (nothing is removed; the member
// "entry" holds it as it is now, with its version), 502 when the store
// failed (its error in the detail: the handler is for operators).
func Handler(store storage.Inspector, opts ...Option) http.Handler {
	var c config
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	h := &handler{store: store, config: c}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /entries", h.list)
	mux.HandleFunc("GET /entry", h.lookup)
	mux.HandleFunc("DELETE /entry", h.remove)
	mux.HandleFunc("GET /stats", h.stats)
	return mux
}

type handler struct {
	store storage.Inspector
	config
}

func (h *handler) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	state, ok := ParseState(q.Get("state"))
	if !ok {
		fail(w, r, http.StatusBadRequest, "state is in_flight, done, committed, issued or all.")
		return
	}
	query := storage.Query{State: state, Cursor: q.Get("cursor")}
	if s := q.Get("min_age"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 {
			fail(w, r, http.StatusBadRequest, "min_age is a duration such as 30s or 5m.")
			return
		}
		query.MinAge = d
	}
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			fail(w, r, http.StatusBadRequest, "limit is a positive number.")
			return
		}
		query.Limit = n
	}
	page, err := h.store.List(r.Context(), query)
	if err != nil {
		h.storeError(w, r, err)
		return
	}
	now := time.Now()
	out := struct {
		Entries []Entry `json:"entries"`
		Next    string  `json:"next,omitempty"`
	}{Entries: make([]Entry, 0, len(page.Entries)), Next: page.Next}
	for _, e := range page.Entries {
		out.Entries = append(out.Entries, View(e, now))
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *handler) lookup(w http.ResponseWriter, r *http.Request) {
	key, ok := entryKey(w, r)
	if !ok {
		return
	}
	body, _ := strconv.ParseBool(r.URL.Query().Get("body"))
	e, err := Lookup(r.Context(), h.store, key, body)
	if err != nil && !errors.Is(err, ErrCorrupt) {
		h.storeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, e) // a corrupt record shows without its response
}

func (h *handler) remove(w http.ResponseWriter, r *http.Request) {
	if !h.config.remove {
		w.Header().Set("Allow", "GET")
		fail(w, r, http.StatusMethodNotAllowed, "This handler removes nothing: it was made without idemadmin.WithRemove.")
		return
	}
	key, ok := entryKey(w, r)
	if !ok {
		return
	}
	version := r.URL.Query().Get("version")
	if version == "" {
		fail(w, r, http.StatusBadRequest, "DELETE /entry takes version=, the entry's version as GET /entry shows it: the entry is removed only if it has not changed since.")
		return
	}
	e, err := h.store.Remove(r.Context(), key, version)
	if errors.Is(err, storage.ErrChanged) {
		changed(w, View(e, time.Now()))
		return
	}
	if err != nil {
		h.storeError(w, r, err)
		return
	}
	v := View(e, time.Now())
	if h.onRemove != nil {
		h.onRemove(r, v)
	}
	writeJSON(w, http.StatusOK, v)
}

func (h *handler) stats(w http.ResponseWriter, r *http.Request) {
	s, err := Count(r.Context(), h.store)
	if err != nil {
		h.storeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s)
}

// changed answers 409: the entry is not the one the operator saw; e is
// the entry as it is now.
func changed(w http.ResponseWriter, e Entry) {
	detail := "The entry changed since it was shown: it is " + e.State + " now (version " + e.Version + "). Nothing was removed. " +
		"The entry as it is now is in \"entry\": to remove it still, send its version."
	writeJSONAs(w, http.StatusConflict, "application/problem+json", struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
		Entry  Entry  `json:"entry"`
	}{"about:blank", http.StatusText(http.StatusConflict), http.StatusConflict, detail, e})
}

// entryKey returns the storage key that the request's query names, or
// answers 400 and returns false.
func entryKey(w http.ResponseWriter, r *http.Request) (string, bool) {
	key, err := KeyFromQuery(r.URL.Query())
	switch {
	case errors.Is(err, idem.ErrInvalidKey):
		detail := strings.Replace(strings.TrimPrefix(err.Error(), "idemadmin: "), "idem: ", "", 1)
		fail(w, r, http.StatusBadRequest, detail+" (the middleware answers 400 to such a key: no entry has it).")
		return "", false
	case err != nil:
		fail(w, r, http.StatusBadRequest, "Name the entry by key= (its storage key), client_key= with scope=, method= and route=, client_key= with op=, or issued_key= with scope=.")
		return "", false
	}
	return key, true
}

// errNoKey: the query names no entry, or names it twice.
var errNoKey = errors.New("idemadmin: name the entry by key= (its storage key), client_key= with scope=, method= and route=, client_key= with op=, or issued_key= with scope=")

// KeyFromQuery returns the storage key that q names, as [Handler]'s
// /entry takes it: key=, or client_key= with scope=, method= and route=,
// or client_key= with op=, or issued_key= with scope=.
//
// key= is a storage key, taken as it stands. client_key= (with method=
// and route=) and issued_key= are read as the middleware reads its key
// header, by idem.ParseKey: "order-42" in RFC 8941 quotes (with \" and \\
// escapes) names the same entry as order-42. client_key= with op= is taken
// as it stands, as Middleware.Do takes its key (idem.CheckKey). A client
// key that the middleware (or Do) refuses is an error wrapping
// idem.ErrInvalidKey. (A middleware WithKey takes its keys as they stand,
// too: the entry of such a key that starts with a double quote is named by
// its storage key.)
func KeyFromQuery(q map[string][]string) (string, error) {
	get := func(name string) string {
		if v := q[name]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	key, client, issued, op := get("key"), get("client_key"), get("issued_key"), get("op")
	scope, method, route := get("scope"), get("method"), get("route")
	switch {
	case key != "" && client == "" && issued == "":
		return key, nil
	case client != "" && op != "" && key == "" && issued == "":
		if err := idem.CheckKey(client); err != nil {
			return "", fmt.Errorf("idemadmin: client_key: %w", err)
		}
		return idem.OperationStorageKey(scope, op, client), nil
	case client != "" && method != "" && route != "" && key == "" && issued == "":
		k, err := idem.ParseKey(client)
		if err != nil {
			return "", fmt.Errorf("idemadmin: client_key: %w", err)
		}
		return idem.StorageKey(scope, method, route, k), nil
	case issued != "" && key == "" && client == "":
		k, err := idem.ParseKey(issued)
		if err != nil {
			return "", fmt.Errorf("idemadmin: issued_key: %w", err)
		}
		return idem.IssuedStorageKey(scope, k), nil
	}
	return "", errNoKey
}

// storeError answers the error of the store: 404 for ErrNotFound, 502
// otherwise.
func (h *handler) storeError(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, storage.ErrNotFound):
		fail(w, r, http.StatusNotFound, "No entry under this key.")
	case errors.Is(err, storage.ErrInvalid):
		fail(w, r, http.StatusBadRequest, err.Error())
	default:
		fail(w, r, http.StatusBadGateway, "The store failed: "+err.Error())
	}
}

// errAdmin is the Kind of the handler's problems.
var errAdmin = errors.New("idemadmin")

func fail(w http.ResponseWriter, r *http.Request, status int, detail string) {
	idem.WriteProblem(w, r, &idem.Error{Kind: errAdmin, Status: status, Title: http.StatusText(status), Detail: detail})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	writeJSONAs(w, status, "application/json", v)
}

func writeJSONAs(w http.ResponseWriter, status int, contentType string, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write(append(body, '\n'))
}
