package idem

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"

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
	var buf []byte
	if r.ContentLength >= 0 {
		buf = make([]byte, 0, r.ContentLength+1)
	} else {
		buf = make([]byte, 0, 512)
	}
	// MaxBytesReader needs the server's own writer to close the connection.
	rd := http.MaxBytesReader(response.Innermost(w), r.Body, max)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
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

// handlerRequest returns the request the handler sees: r with the
// buffered body and the Info in its context, both held in st.
func handlerRequest(r *http.Request, body []byte, st *handlerState, info Info) *http.Request {
	st.ctx = infoCtx{Context: r.Context(), info: info}
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
