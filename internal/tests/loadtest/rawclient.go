package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
)

// rawConn is one load client's keep-alive HTTP/1.1 connection to the
// server under test. It writes requests and reads answers itself, with
// no allocation per request, so that the load generator, which shares
// the machine's cores with the server and Redis, takes as little of them
// as it can: net/http's client spends about as much CPU per request as
// the server does. The server is net/http, as in production.
type rawConn struct {
	c   net.Conn
	r   *bufio.Reader
	w   *bufio.Writer
	buf []byte // the answer's body
}

func dialRaw(addr string) (*rawConn, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	return &rawConn{c: c, r: bufio.NewReaderSize(c, 4096), w: bufio.NewWriterSize(c, 4096)}, nil
}

func (c *rawConn) Close() error { return c.c.Close() }

// answer is what a request got.
type answer struct {
	status   int
	replayed bool   // Idempotent-Replayed: true
	body     []byte // valid until the next request
}

// post sends POST path with the JSON body and the Idempotency-Key key
// (none when ""), and reads the answer, which must have a Content-Length.
func (c *rawConn) post(path, key string, body []byte) (answer, error) {
	w := c.w
	w.WriteString("POST ")
	w.WriteString(path)
	w.WriteString(" HTTP/1.1\r\nHost: loadtest\r\nContent-Type: application/json\r\n")
	if key != "" {
		w.WriteString("Idempotency-Key: ")
		w.WriteString(key)
		w.WriteString("\r\n")
	}
	w.WriteString("Content-Length: ")
	var n [20]byte
	w.Write(strconv.AppendInt(n[:0], int64(len(body)), 10))
	w.WriteString("\r\n\r\n")
	w.Write(body)
	if err := w.Flush(); err != nil {
		return answer{}, err
	}
	return c.read()
}

var (
	contentLength = []byte("content-length:")
	replayedTrue  = []byte("idempotent-replayed: true")
	chunked       = []byte("transfer-encoding:")
)

// read reads one answer: the status line, the headers, then
// Content-Length bytes of body.
func (c *rawConn) read() (answer, error) {
	line, err := c.r.ReadSlice('\n')
	if err != nil {
		return answer{}, err
	}
	// "HTTP/1.1 201 Created\r\n"
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.1 ")) {
		return answer{}, fmt.Errorf("bad status line %q", line)
	}
	status, ok := atoi(line[9:12])
	if !ok {
		return answer{}, fmt.Errorf("bad status line %q", line)
	}
	a := answer{status: status}
	size := -1
	for {
		line, err := c.r.ReadSlice('\n')
		if err != nil {
			return answer{}, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			break
		}
		switch {
		case hasPrefixFold(line, contentLength):
			var ok bool
			if size, ok = atoi(bytes.TrimSpace(line[len(contentLength):])); !ok {
				return answer{}, fmt.Errorf("bad header %q", line)
			}
		case hasPrefixFold(line, replayedTrue):
			a.replayed = true
		case hasPrefixFold(line, chunked):
			return answer{}, errors.New("a chunked answer: the load tool reads Content-Length bodies only")
		}
	}
	if size < 0 {
		return answer{}, errors.New("an answer without Content-Length")
	}
	if cap(c.buf) < size {
		c.buf = make([]byte, size)
	}
	c.buf = c.buf[:size]
	if _, err := io.ReadFull(c.r, c.buf); err != nil {
		return answer{}, err
	}
	a.body = c.buf
	return a, nil
}

func hasPrefixFold(s, prefix []byte) bool {
	return len(s) >= len(prefix) && bytes.EqualFold(s[:len(prefix)], prefix)
}

// atoi reads a decimal number of 1 to 9 digits.
func atoi(b []byte) (int, bool) {
	if len(b) == 0 || len(b) > 9 {
		return 0, false
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}
