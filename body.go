package idem

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/idemkit/idem/response"
)

// readBody reads the whole request body, refusing one over max bytes
// without reading past it.
func readBody(w http.ResponseWriter, r *http.Request, max int64) ([]byte, *Error) {
	if r.ContentLength > max {
		return nil, newError(ErrBodyTooLarge, fmt.Sprintf("The request body is larger than %d bytes.", max), 0, nil)
	}
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	// The buffer grows as bytes arrive, never ahead of them on the word of
	// a Content-Length: a client that declares a large body and sends
	// nothing holds bodyFirstRead bytes, not max. With a declared length
	// it grows no further than that length (and a byte, to see EOF).
	limit := int64(-1)
	if r.ContentLength >= 0 {
		limit = r.ContentLength + 1
	}
	buf := make([]byte, 0, bodyCap(bodyFirstRead, limit))
	// MaxBytesReader needs the server's own writer to close the connection.
	rd := http.MaxBytesReader(response.Innermost(w), r.Body, max)
	for {
		if len(buf) == cap(buf) {
			grown := make([]byte, len(buf), bodyCap(2*cap(buf), limit))
			copy(grown, buf)
			buf = grown
		}
		n, err := rd.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				return nil, newError(ErrBodyTooLarge, fmt.Sprintf("The request body is larger than %d bytes.", max), 0, nil)
			}
			return nil, newError(ErrBodyRead, "The request body could not be read.", 0, err)
		}
	}
}

// bodyFirstRead is the capacity of a request body's buffer before any of
// it has arrived.
const bodyFirstRead = 4 << 10

// bodyCap is n, but no more than limit when limit is not negative, and at
// least 1.
func bodyCap(n int, limit int64) int {
	if limit >= 0 && int64(n) > limit {
		n = int(limit)
	}
	return max(n, 1)
}

// handlerRequest returns the request the handler sees: r with the
// buffered body and the Info in its context, both held in st.
func handlerRequest(r *http.Request, body []byte, st *handlerState, info Info, ttl time.Duration) *http.Request {
	st.ctx.set(r.Context(), info, ttl)
	r = r.WithContext(&st.ctx)
	if body != nil {
		st.body.Reset(body)
		r.Body = &st.body
		r.ContentLength = int64(len(body))
	}
	return r
}

// bodyReader gives the handler the buffered body.
type bodyReader struct{ bytes.Reader }

func (*bodyReader) Close() error { return nil }
