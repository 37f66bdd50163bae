// Package idemadmin shows an operator what an idem store holds, and
// removes an entry by hand: the JSON view of an entry that cmd/idemctl
// prints and [Handler] serves, and that handler, an http.Handler to mount
// behind the application's own authentication. Nothing is mounted by
// default, and the handler removes nothing unless [WithRemove] says so;
// then it removes an entry only if it has not changed since the operator
// saw it (its [Entry.Version]).
//
// It works on any store that implements storage.Inspector: every store
// of this module does (memstore, redisstore, pgstore).
package idemadmin

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idem/internal/httprec"
	"github.com/idemkit/idem/storage"
)

// Entry is what an operator sees of one entry: storage.Entry with its
// state as a word, times in RFC 3339, durations in milliseconds, and, for
// a done entry that was looked up, the response it holds, without its
// body and headers unless asked (they hold what the application sent to
// its client).
type Entry struct {
	// Key is the storage key.
	Key string `json:"key"`
	// State is "in_flight", "done", "committed" or "issued".
	State string `json:"state"`
	// Fingerprint is the request's fingerprint, in hex; empty for an
	// issued entry and for requests without a fingerprint.
	Fingerprint string `json:"fingerprint,omitempty"`
	// Since is when the entry entered its state, by the store's clock;
	// nil when the store cannot tell.
	Since *time.Time `json:"since,omitempty"`
	// AgeMS is how long ago Since was, in milliseconds, when the entry
	// was read; absent with Since.
	AgeMS *int64 `json:"age_ms,omitempty"`
	// LeaseLeftMS is how long the lease of an in-flight or committed
	// entry still runs, in milliseconds.
	LeaseLeftMS int64 `json:"lease_left_ms,omitempty"`
	// Expires is when the store forgets the entry unless it is renewed.
	Expires time.Time `json:"expires"`
	// Size is the length of a done entry's stored record, in bytes.
	Size int `json:"size,omitempty"`
	// Response is a done entry's stored response; set by [Lookup] only.
	Response *Response `json:"response,omitempty"`
	// Version names this incarnation of the entry (storage.Entry's):
	// DELETE /entry and idemctl rm send it back, and the entry is removed
	// only if it has not changed since it was shown.
	Version string `json:"version"`
}

// Response is a stored response.
type Response struct {
	// Status is the status the client got; 0 when unknown (a hijacked
	// connection).
	Status int `json:"status"`
	// NotReplayable reports that the handler completed but its response
	// was not kept (too large, hijacked, cut short): a retry gets 409.
	NotReplayable bool `json:"not_replayable,omitempty"`
	// ContentType is the response's Content-Type.
	ContentType string `json:"content_type,omitempty"`
	// BodySize is the length of the body, in bytes.
	BodySize int `json:"body_size"`
	// Header and Trailer are the stored headers and trailers, and Body
	// the body: only when asked for (withBody).
	Header  http.Header `json:"header,omitempty"`
	Trailer http.Header `json:"trailer,omitempty"`
	// Body is the body. In JSON (see [Response.MarshalJSON]) it is the
	// string "body", with "body_encoding" saying how to read it.
	Body []byte `json:"-"`
}

// Body encodings: [Response.BodyEncoding]'s words.
const (
	BodyText   = "text"
	BodyBase64 = "base64"
)

// BodyEncoding says how the JSON of r holds its body: BodyText, the body
// as it is, when it is valid UTF-8 and its ContentType is textual (text/*,
// JSON, XML, JavaScript, a form) or empty (Middleware.Do's results have
// none); BodyBase64, in standard base64 with padding, otherwise. "" when
// r has no body.
func (r Response) BodyEncoding() string {
	switch {
	case len(r.Body) == 0:
		return ""
	case utf8.Valid(r.Body) && textual(r.ContentType):
		return BodyText
	}
	return BodyBase64
}

// textual reports whether a body of the content type ct is text.
func textual(ct string) bool {
	if ct == "" {
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	switch mt {
	case "application/json", "application/xml", "application/javascript", "application/x-www-form-urlencoded", "application/x-ndjson":
		return true
	}
	return strings.HasPrefix(mt, "text/") || strings.HasSuffix(mt, "+json") || strings.HasSuffix(mt, "+xml")
}

// MarshalJSON writes r as an object with the fields of its JSON tags, and
// its body (when it has one) as the string "body", with "body_encoding"
// "text" or "base64" ([Response.BodyEncoding]): a JSON response shows as
// the text it is, a binary one survives.
func (r Response) MarshalJSON() ([]byte, error) {
	type plain Response
	out := struct {
		plain
		Body         string `json:"body,omitempty"`
		BodyEncoding string `json:"body_encoding,omitempty"`
	}{plain: plain(r), BodyEncoding: r.BodyEncoding()}
	switch out.BodyEncoding {
	case BodyText:
		out.Body = string(r.Body)
	case BodyBase64:
		out.Body = base64.StdEncoding.EncodeToString(r.Body)
	}
	return json.Marshal(out)
}

// UnmarshalJSON reads what MarshalJSON writes.
func (r *Response) UnmarshalJSON(b []byte) error {
	type plain Response
	var in struct {
		plain
		Body         string `json:"body"`
		BodyEncoding string `json:"body_encoding"`
	}
	if err := json.Unmarshal(b, &in); err != nil {
		return err
	}
	*r = Response(in.plain)
	switch in.BodyEncoding {
	case BodyText, "":
		if in.Body != "" {
			r.Body = []byte(in.Body)
		}
	case BodyBase64:
		body, err := base64.StdEncoding.DecodeString(in.Body)
		if err != nil {
			return fmt.Errorf("idemadmin: body: %w", err)
		}
		r.Body = body
	default:
		return fmt.Errorf("idemadmin: body_encoding %q: want text or base64", in.BodyEncoding)
	}
	return nil
}

// ErrCorrupt is wrapped by the error of [Lookup] when a done entry's
// record cannot be read as a response.
var ErrCorrupt = errors.New("idemadmin: the stored record is not a response")

// View returns what an operator sees of e, read at now (which AgeMS is
// measured from: give the store's clock when you have it, time.Now
// otherwise). It decodes no record: Response stays nil.
func View(e storage.Entry, now time.Time) Entry {
	v := Entry{
		Key:         e.Key,
		State:       StateName(e.State),
		Fingerprint: hex.EncodeToString([]byte(e.Fingerprint)),
		LeaseLeftMS: e.LeaseLeft.Milliseconds(),
		Expires:     e.Expires,
		Size:        e.Size,
		Version:     e.Version,
	}
	if !e.Since.IsZero() {
		since := e.Since
		age := max(now.Sub(since), 0).Milliseconds()
		v.Since, v.AgeMS = &since, &age
	}
	return v
}

// Lookup looks up the entry under key in store, with its response when it
// is done: the status, content type and body size always, the headers,
// trailers and body only when withBody is set. Errors wrap
// storage.ErrNotFound, [ErrCorrupt], or the store's.
func Lookup(ctx context.Context, store storage.Inspector, key string, withBody bool) (Entry, error) {
	e, err := store.Lookup(ctx, key, true)
	if err != nil {
		return Entry{}, err
	}
	v := View(e, time.Now())
	if e.State != storage.Done {
		return v, nil
	}
	var rec httprec.Record
	if err := rec.UnmarshalBinary(e.Record); err != nil {
		return v, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	v.Response = &Response{
		Status:        rec.Status,
		NotReplayable: rec.NotReplayable,
		ContentType:   rec.Header.Get("Content-Type"),
		BodySize:      len(rec.Body),
	}
	if withBody {
		v.Response.Header, v.Response.Trailer, v.Response.Body = rec.Header, rec.Trailer, rec.Body
	}
	return v, nil
}

// StateName is the word for an entry's state: "in_flight", "done",
// "committed", "issued"; "" for any other State.
func StateName(s storage.State) string {
	switch s {
	case storage.InFlight:
		return "in_flight"
	case storage.Done:
		return "done"
	case storage.Committed:
		return "committed"
	case storage.Issued:
		return "issued"
	}
	return ""
}

// ParseState is StateName's inverse; "" and "all" are 0 (every state).
// ok is false for another word.
func ParseState(name string) (s storage.State, ok bool) {
	switch name {
	case "", "all":
		return 0, true
	case "in_flight":
		return storage.InFlight, true
	case "done":
		return storage.Done, true
	case "committed":
		return storage.Committed, true
	case "issued":
		return storage.Issued, true
	}
	return 0, false
}
