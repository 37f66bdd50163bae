package idemclient

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
)

// body is how a protected request's body is sent on each attempt.
type body struct {
	first      io.ReadCloser                 // the first attempt's
	get        func() (io.ReadCloser, error) // the following attempts'; nil for no body
	length     int64                         // ContentLength to send
	rewindable bool                          // false: the body can be sent only once
}

// prepareBody decides how req's body is sent: as it is when it has none
// or has GetBody, else buffered up to max bytes. A larger body streams
// once: its first max+1 bytes, then the rest. The error is that of reading
// the body; req.Body is then closed.
func prepareBody(req *http.Request, max int64) (body, error) {
	b := body{first: req.Body, get: req.GetBody, length: req.ContentLength, rewindable: true}
	if req.Body == nil || req.Body == http.NoBody || req.GetBody != nil {
		return b, nil
	}
	if req.ContentLength > max || max == 0 {
		b.rewindable = false
		return b, nil
	}
	size := int64(512)
	if req.ContentLength > 0 {
		size = req.ContentLength + 1 // + 1 to see the EOF without growing
	}
	buf, err := readUpTo(req.Body, max+1, make([]byte, 0, min(size, max+1)))
	if err != nil {
		req.Body.Close()
		return body{}, fmt.Errorf("idemclient: reading the request body: %w", err)
	}
	if int64(len(buf)) > max {
		b.first = &prefixedBody{Reader: io.MultiReader(bytes.NewReader(buf), req.Body), Closer: req.Body}
		b.rewindable = false
		return b, nil
	}
	req.Body.Close()
	if len(buf) == 0 {
		b.first, b.get, b.length = http.NoBody, nil, 0
		return b, nil
	}
	b.get = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf)), nil }
	b.first, _ = b.get()
	if b.length <= 0 { // unknown: now known
		b.length = int64(len(buf))
	}
	return b, nil
}

// readUpTo appends to buf what r gives, up to limit bytes in all, and
// returns it; io.EOF ends it without an error.
func readUpTo(r io.Reader, limit int64, buf []byte) ([]byte, error) {
	for int64(len(buf)) < limit {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		room := buf[len(buf):min(int64(cap(buf)), limit)]
		n, err := r.Read(room)
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
	return buf, nil
}

// prefixedBody is a body whose first bytes were already read: it reads
// them, then the rest, and closes the original.
type prefixedBody struct {
	io.Reader
	io.Closer
}
