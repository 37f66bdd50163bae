package idemadmin

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
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
// entry as it was: the place to log or audit who removed what. Without
// it, DELETE /entry answers 405.
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
//	DELETE /entry    removes the entry and answers it as it was (only WithRemove)
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
// Errors are RFC 9457 problems: 400 for a bad parameter, 404 when there is
// no such entry, 405 for DELETE without WithRemove, 502 when the store
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
	e, err := h.store.Remove(r.Context(), key)
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

// entryKey returns the storage key that the request's query names, or
// answers 400 and returns false.
func entryKey(w http.ResponseWriter, r *http.Request) (string, bool) {
	key, err := KeyFromQuery(r.URL.Query())
	if err != nil {
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
		return idem.OperationStorageKey(scope, op, client), nil
	case client != "" && method != "" && route != "" && key == "" && issued == "":
		return idem.StorageKey(scope, method, route, client), nil
	case issued != "" && key == "" && client == "":
		return idem.IssuedStorageKey(scope, issued), nil
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
	body, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write(append(body, '\n'))
}
