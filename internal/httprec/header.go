package httprec

import (
	"net/http"
	"net/textproto"
	"strings"
)

// Omitted reports whether the header name is one that is never recorded nor
// replayed, whatever the caller's omit function says: the hop-by-hop headers
// Connection, Keep-Alive, Proxy-Connection, Transfer-Encoding, Upgrade and TE,
// and Date and Content-Length, which describe one transmission rather than the
// response (Replay sets a fresh Content-Length; the server sets Date). The
// Trailer declaration is kept, since a replay must declare its trailers.
// The name is compared in its canonical form.
func Omitted(name string) bool {
	switch http.CanonicalHeaderKey(name) {
	case "Connection", "Keep-Alive", "Proxy-Connection", "Transfer-Encoding",
		"Upgrade", "Te", "Date", "Content-Length":
		return true
	}
	return false
}

// bodyAllowedForStatus reports whether a response with the status may carry a
// body, as net/http decides it.
func bodyAllowedForStatus(status int) bool {
	switch {
	case status >= 100 && status <= 199:
		return false
	case status == http.StatusNoContent, status == http.StatusNotModified:
		return false
	}
	return true
}

// validTrailer reports whether net/http sends a declared trailer with this
// canonical name (RFC 9110 section 6.5.1 forbids framing, routing, request
// modifier, authentication, control and content-type fields; net/http drops
// them, see golang.org/x/net/http/httpguts.ValidTrailerHeader).
func validTrailer(name string) bool {
	if strings.HasPrefix(name, "If-") {
		return false
	}
	switch name {
	case "Authorization", "Cache-Control", "Connection", "Content-Encoding",
		"Content-Length", "Content-Range", "Content-Type", "Expect", "Host",
		"Keep-Alive", "Max-Forwards", "Pragma", "Proxy-Authenticate",
		"Proxy-Authorization", "Proxy-Connection", "Range", "Realm", "Te",
		"Trailer", "Transfer-Encoding", "Www-Authenticate":
		return false
	}
	return true
}

// nextElement splits the first comma-separated element off a header value,
// trimmed as net/http trims it. It returns the element (possibly empty) and
// the rest of the value.
func nextElement(v string) (elem, rest string) {
	elem, rest, _ = strings.Cut(v, ",")
	return textproto.TrimString(elem), rest
}

// declares reports whether the Trailer header values declare the canonical
// name.
func declares(trailer []string, name string) bool {
	for _, v := range trailer {
		for v != "" {
			var e string
			e, v = nextElement(v)
			if e != "" && http.CanonicalHeaderKey(e) == name {
				return true
			}
		}
	}
	return false
}
