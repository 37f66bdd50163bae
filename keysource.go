package idem

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// A KeySource finds a request's idempotency key somewhere other than the
// key header: in another header, a form field or a JSON field of the body,
// as a payment provider's callback or a webhook carries its event's id.
// Install one with [WithKey]; [KeyFromHeader], [KeyFromForm] and
// [KeyFromJSON] cover the common sources.
//
// It gets the request and its body, already read in full (bounded by
// WithMaxRequestBody; r.Body must not be read), and returns the key, or ""
// when the request carries none, or an error when the request is
// malformed where the key should be. The message of the error goes into
// the 400 problem the client gets: it must not quote the request's data.
type KeySource func(r *http.Request, body []byte) (key string, err error)

// WithKey makes the middleware take the key from src instead of the key
// header (WithHeader). Since src may read the body, the body of every
// request with a protected method (WithMethods) is read first, bounded by
// WithMaxRequestBody.
//
//   - A request for which src finds no key gets 400 ErrMissingKey: a
//     callback always carries its id, so WithRequireKey is implied.
//   - An error of src, or a key that is not 1 to 255 bytes of printable
//     ASCII, gets 400 ErrInvalidKey.
//   - The key is then used as a header's would be: hashed with the scope,
//     method and route into the store key, and given to the handler as
//     Info.Key.
//
// The request comparison defaults to none with WithKey, as if
// WithoutFingerprint were given (WithFingerprint, after WithKey or before
// it, still sets one): the key is the sender's id of one event, which a
// provider redelivers with the same body, or with a body that differs in a
// delivery timestamp or a signature (a fingerprint of the body would turn
// such a redelivery into a 422, which the provider retries forever).
// Verify a callback's signature before the middleware, so that a forged
// request cannot take an event's key. The scope stays WithScope's, by
// default the principal that the application's authentication named (see
// WithScope: a request with an Authorization header and no principal is
// refused). A sender of callbacks has no principal of its own there and
// may start or stop sending credentials: give such a route
// WithScope(func(*http.Request) string { return "stripe" }), a constant
// per sender, so that a redelivery is always in the first's scope. A nil
// src is invalid.
func WithKey(src KeySource) Option {
	return func(c *config) error {
		if src == nil {
			return invalid("WithKey(nil)")
		}
		c.keySource = src
		if !c.fpSet {
			c.fingerprint, c.noFP = nil, true
		}
		return nil
	}
}

// KeyFromHeader reads the key from the header name, as its value stands
// (no RFC 8941 unquoting): GitHub's X-GitHub-Delivery, Shopify's
// X-Shopify-Event-Id. A header sent more than once is an error.
func KeyFromHeader(name string) KeySource {
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request, _ []byte) (string, error) {
		switch vs := r.Header[name]; len(vs) {
		case 0:
			return "", nil
		case 1:
			return vs[0], nil
		}
		return "", fmt.Errorf("the %s header was sent more than once", name)
	}
}

// KeyFromForm reads the key from the fields of an
// application/x-www-form-urlencoded body, as an Alipay notification
// carries notify_id, trade_no and trade_status: with one field, its value;
// with several, their values joined by ":" in the order given (the key of
// a payment's status change: KeyFromForm("trade_no", "trade_status")),
// each with its "%" and ":" percent-encoded, so that two different sets
// of values never join into the same key.
// The request has no key when a field is absent or empty; a body of
// another media type, a malformed body, or a field sent twice is an error.
// It panics without fields.
func KeyFromForm(fields ...string) KeySource {
	if len(fields) == 0 {
		panic("idem: KeyFromForm without fields")
	}
	fields = append([]string(nil), fields...)
	return func(r *http.Request, body []byte) (string, error) {
		if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/x-www-form-urlencoded" {
			return "", errors.New("the body is not application/x-www-form-urlencoded")
		}
		form, err := url.ParseQuery(string(body))
		if err != nil {
			return "", errors.New("the form body is malformed")
		}
		vals := make([]string, len(fields))
		for i, f := range fields {
			switch vs := form[f]; {
			case len(vs) > 1:
				return "", fmt.Errorf("the form field %q was sent more than once", f)
			case len(vs) == 0 || vs[0] == "":
				return "", nil
			case len(fields) == 1:
				return vs[0], nil
			default:
				vals[i] = joinEscaper.Replace(vs[0])
			}
		}
		return strings.Join(vals, ":"), nil
	}
}

// joinEscaper encodes the values that KeyFromForm joins.
var joinEscaper = strings.NewReplacer("%", "%25", ":", "%3A")

// KeyFromJSON reads the key from a JSON body, at the path of object
// members given (KeyFromJSON("id") for a Stripe event, KeyFromJSON("data",
// "object", "id") for a nested one). The member must be a string or a
// number (a number is used as written). The request has no key when a
// member of the path is absent or null, or the string is empty; a body
// that is not JSON, or a path through something other than an object, is
// an error.
//
// So is an ambiguous member: an object of the path holding the name twice,
// or holding another member whose name matches it but for case
// ({"id":"evt_1","ID":"evt_2"}). encoding/json matches names without
// regard to case and lets the last member win, so the handler would
// process another id than the key: such a body gets 400 ErrInvalidKey. It
// panics without a path.
func KeyFromJSON(path ...string) KeySource {
	if len(path) == 0 {
		panic("idem: KeyFromJSON without a path")
	}
	path = append([]string(nil), path...)
	return func(_ *http.Request, body []byte) (string, error) {
		raw := json.RawMessage(body)
		for i, name := range path {
			v, err := jsonMember(raw, name)
			switch {
			case errors.Is(err, errNotObject) && i == 0:
				return "", errors.New("the body is not a JSON object")
			case errors.Is(err, errNotObject):
				return "", fmt.Errorf("the JSON member %q is not an object", strings.Join(path[:i], "."))
			case errors.Is(err, errAmbiguous):
				return "", fmt.Errorf("the JSON member %q is ambiguous: its name appears more than once, perhaps in another case", strings.Join(path[:i+1], "."))
			case err != nil:
				return "", errors.New("the body is not valid JSON")
			case v == nil:
				return "", nil
			}
			raw = v
		}
		switch {
		case len(raw) == 0 || string(raw) == "null":
			return "", nil
		case raw[0] == '"':
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return "", errors.New("the JSON key is a malformed string")
			}
			return s, nil
		case raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9':
			if _, err := strconv.ParseFloat(string(raw), 64); err != nil {
				return "", errors.New("the JSON key is a malformed number")
			}
			return string(raw), nil
		}
		return "", fmt.Errorf("the JSON member %q is neither a string nor a number", strings.Join(path, "."))
	}
}

var (
	errNotObject = errors.New("not a JSON object")
	errAmbiguous = errors.New("ambiguous JSON member")
)

// jsonMember returns the value of the member name of the JSON object raw,
// or nil when it has none. It returns errNotObject when raw is not an
// object (a valid JSON value of another kind), and errAmbiguous when more
// than one member's name equals name under Unicode case folding, which is
// how encoding/json matches names to fields. Any other error means raw is
// not valid JSON.
func jsonMember(raw json.RawMessage, name string) (json.RawMessage, error) {
	if !json.Valid(raw) {
		return nil, errors.New("invalid JSON")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil {
		return nil, err
	} else if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, errNotObject
	}
	var found json.RawMessage
	matches := 0
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, _ := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		if strings.EqualFold(key, name) {
			if matches++; matches > 1 {
				return nil, errAmbiguous
			}
			found = v
		}
	}
	return found, nil
}

// sourceKey reads the key of a request with src, and checks it as a bare
// header value is checked. It returns the problem a request without a
// valid key gets.
func sourceKey(src KeySource, r *http.Request, body []byte) (string, *Error) {
	key, err := src(r, body)
	switch {
	case err != nil:
		return "", newError(ErrInvalidKey, "The request's idempotency key could not be read: "+err.Error()+".", 0, nil)
	case key == "":
		return "", newError(ErrMissingKey, "The request carries no idempotency key where this endpoint reads it.", 0, nil)
	}
	if err := checkBareKey(key); err != nil {
		return "", newError(ErrInvalidKey, "The request's idempotency key is invalid: "+err.Error()+".", 0, nil)
	}
	return key, nil
}
