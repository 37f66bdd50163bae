package nethttp

import (
	"context"
	"io"
	"net/http"
	"net/http/httptrace"
	"sync/atomic"

	"github.com/idemkit/idem"
)

// ProxyTransport returns a RoundTripper for a reverse proxy
// (httputil.ReverseProxy) that the middleware protects: it keeps the
// upstream from running a protected request twice when its outcome is
// unknown. next is the transport that does the work (nil means
// http.DefaultTransport).
//
//   - A round trip that fails after the request's headers were written (a
//     timeout, a reset, the client giving up while the upstream works)
//     may have reached the upstream, which may have acted on it: the
//     execution is marked done ([idem.MarkDone]) before the proxy answers
//     502, so retries get 409 (ErrNotReplayable) rather than a second
//     upstream call. Headers written into the connection's buffer count,
//     even if they never left it: the mark errs on the safe side.
//   - A response whose body then fails to arrive whole (the connection
//     closes or resets mid-body, a deadline passes while it comes) came
//     from an upstream that may have acted: the first read of its body
//     that fails (any error but io.EOF) marks the execution done, whatever
//     the proxy does next: ReverseProxy's copy aborting the handler before
//     or after it sent a byte, or a ModifyResponse that reads the body and
//     fails, whose 502 would otherwise release the key. Retries get 409.
//     A body read to its end, and a 101 Switching Protocols response
//     (whose body is the connection), are left as they are.
//   - A round trip that fails before that (no connection, refused) leaves
//     the key to be released by the proxy's 502: a retry tries the
//     upstream again.
//   - Go's transport takes a bodiless request that carries an
//     Idempotency-Key header as safe to send again, and resends it by
//     itself when a reused connection closes before the answer. A
//     protected request without a body is sent with an empty body of its
//     own (a chunked body of no bytes), which the transport never resends.
//     Requests the middleware does not protect keep the transport's own
//     behaviour.
func ProxyTransport(next http.RoundTripper) http.RoundTripper {
	if next == nil {
		next = http.DefaultTransport
	}
	return proxyTransport{next}
}

type proxyTransport struct{ next http.RoundTripper }

func (t proxyTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	info, _ := idem.FromContext(req.Context())
	if !info.Protected {
		return t.next.RoundTrip(req)
	}
	var wrote atomic.Bool
	trace := &httptrace.ClientTrace{WroteHeaders: func() { wrote.Store(true) }}
	out := req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
	if out.Body == nil || out.Body == http.NoBody {
		out.Body, out.ContentLength = emptyBody{}, 0
	}
	res, err := t.next.RoundTrip(out)
	if err != nil && wrote.Load() {
		idem.MarkDone(req.Context())
	}
	if err == nil && res.Body != nil && res.Body != http.NoBody && res.StatusCode != http.StatusSwitchingProtocols {
		res.Body = &doneOnReadError{ReadCloser: res.Body, ctx: req.Context()}
	}
	return res, err
}

// doneOnReadError is the body of a protected request's response: a read
// that fails marks the execution done (see ProxyTransport).
type doneOnReadError struct {
	io.ReadCloser
	ctx context.Context
}

func (b *doneOnReadError) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF {
		idem.MarkDone(b.ctx)
	}
	return n, err
}

// emptyBody is a request body of no bytes that is not http.NoBody.
type emptyBody struct{}

func (emptyBody) Read([]byte) (int, error) { return 0, io.EOF }
func (emptyBody) Close() error             { return nil }
