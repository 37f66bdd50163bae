package idemclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// Transport is an [http.RoundTripper] that gives every protected request
// an idempotency key and retries it with that same key by the table of the
// package documentation. Use it as the Transport of an [http.Client]. It
// is safe for concurrent use; its options are fixed by [New].
type Transport struct {
	cfg config

	// Test hooks; nil means time.Now, sleep and math/rand/v2.
	now   func() time.Time
	sleep func(ctx context.Context, cancel <-chan struct{}, d time.Duration) error
	rand  func(max time.Duration) time.Duration
}

// New returns a Transport configured by opts, over http.DefaultTransport
// unless WithBase says otherwise. It panics on an invalid option value
// (see each option).
func New(opts ...Option) *Transport {
	t := &Transport{cfg: defaults(), now: time.Now, sleep: sleep}
	for _, o := range opts {
		o(&t.cfg)
	}
	return t
}

// errNilResponse replaces a base RoundTripper's (nil, nil).
var errNilResponse = errors.New("idemclient: the base RoundTripper returned neither a response nor an error")

// RoundTrip sends req. A request whose method the transport does not
// protect goes to the base RoundTripper untouched. A protected one is sent
// with its key (its own key header, the key of [WithKey], or a new
// [NewKey]) on every attempt, and retried by the table of the package
// documentation.
//
// It returns the final response, or the error of a failure that calls for
// no retry as the base gave it, or an [*Error] when a failure called for a
// retry that the limits did not allow, or the context's error when the
// context ended during a wait. A response that still called for a retry
// (a 503 after the last attempt, say) is returned as it is; [ResultOf]
// tells why it was not retried. The responses of the attempts before are
// read (up to 4 KiB) and closed. req is not modified; its body is closed
// as the RoundTripper contract requires.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL == nil || req.Header == nil || !t.protects(req.Method) {
		return t.cfg.base.RoundTrip(req)
	}
	c := &call{Context: req.Context()}
	header := req.Header
	if vs := req.Header[t.cfg.header]; len(vs) > 0 {
		c.res.Key = vs[0]
	} else {
		v, err := keyValue(c.Context)
		if err != nil {
			if req.Body != nil {
				req.Body.Close()
			}
			return nil, err
		}
		c.res.Key, c.hv[0] = v, v
		header = make(http.Header, len(req.Header)+1)
		for k, vs := range req.Header {
			header[k] = vs
		}
		header[t.cfg.header] = c.hv[:]
	}
	b, err := prepareBody(req, t.cfg.maxBody)
	if err != nil {
		return nil, err
	}

	tmpl := req.WithContext(c) // the request of every attempt, but for its body
	tmpl.Header = header
	tmpl.ContentLength = b.length
	if b.rewindable {
		tmpl.GetBody = b.get // lets http.Transport resend by itself too
	}
	r := tmpl
	r.Body = b.first

	start := t.now()
	deadline, hasDeadline := c.Deadline()
	for n := 1; ; n++ {
		began := t.now()
		resp, err := t.cfg.base.RoundTrip(r)
		if err == nil && resp == nil {
			err = errNilResponse
		}
		if err != nil {
			resp = nil
		}
		var (
			v        verdict
			replayed bool
		)
		if err != nil {
			v.retry = retryableError(r, err)
		} else {
			replayed = isReplayed(resp)
			v = t.judgeResponse(resp, replayed)
		}
		ended := t.now()

		var (
			wait time.Duration
			stop error
			next io.ReadCloser
		)
		if v.retry {
			wait = t.wait(n, v)
			at := ended.Add(wait)
			switch {
			case !b.rewindable:
				stop = ErrBodyNotRewindable
			case n >= t.cfg.maxAttempts:
				stop = ErrAttemptsExhausted
			case t.cfg.maxElapsed > 0 && at.Sub(start) > t.cfg.maxElapsed, hasDeadline && !at.Before(deadline):
				stop = ErrTimeExhausted
			case b.get == nil:
				next = b.first // nil or http.NoBody
			default:
				nb, gerr := b.get()
				if gerr != nil {
					stop = fmt.Errorf("%w: GetBody: %w", ErrBodyNotRewindable, gerr)
				} else {
					next = nb
				}
			}
			if stop != nil {
				wait = 0
			}
		}
		if t.cfg.hook != nil {
			a := Attempt{
				Context: c.Context, Method: r.Method, URL: r.URL, N: n,
				Replayed: replayed, Err: err, Duration: ended.Sub(began),
				Retry: v.retry && stop == nil, Wait: wait, Stop: stop,
			}
			if resp != nil {
				a.StatusCode, a.Header = resp.StatusCode, resp.Header
			}
			t.cfg.hook(a)
		}

		if !v.retry || stop != nil {
			c.res.Attempts = n
			if err != nil {
				if stop != nil {
					return nil, &Error{Reason: stop, Attempts: n, Err: err}
				}
				return nil, err
			}
			c.res.Replayed, c.res.Err = replayed, stop
			if resp.Request == nil || resp.Request.Context().Value(callKey{}) != c {
				resp.Request = r
			}
			return resp, nil
		}

		if resp != nil {
			discard(resp)
		}
		//lint:ignore SA1019 a caller's deprecated Cancel channel is honoured as well as its context.
		if err := t.sleep(c, r.Cancel, wait); err != nil {
			if next != nil {
				next.Close()
			}
			return nil, err
		}
		r = new(http.Request)
		*r = *tmpl
		r.Body = next
	}
}

// protects reports whether requests with method are protected.
func (t *Transport) protects(method string) bool {
	if method == "" {
		method = http.MethodGet
	}
	for _, m := range t.cfg.methods {
		if m == method {
			return true
		}
	}
	return false
}

// isReplayed reports whether resp is a replay of a stored response.
func isReplayed(resp *http.Response) bool {
	vs := resp.Header[replayedHeader]
	return len(vs) > 0 && vs[0] == "true"
}

// discard reads a little of a response that will not be returned, so that
// its connection can be reused, and closes it.
func discard(resp *http.Response) {
	io.CopyN(io.Discard, resp.Body, 4<<10)
	resp.Body.Close()
}

// CloseIdleConnections closes the idle connections of the base
// RoundTripper, if it has such a method ([http.Client.CloseIdleConnections]
// calls it).
func (t *Transport) CloseIdleConnections() {
	if ci, ok := t.cfg.base.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
}
