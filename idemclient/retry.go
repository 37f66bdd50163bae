package idemclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"time"
)

// replayedHeader marks a replayed response (the kit's middleware, and the
// IETF draft's convention).
const replayedHeader = "Idempotent-Replayed"

// maxRetryAfter caps a Retry-After value before it is turned into a
// duration: far above any sensible MaxElapsed, far below an overflow.
const maxRetryAfter = 24 * time.Hour

// verdict is what one attempt's outcome calls for.
type verdict struct {
	retry      bool          // another attempt is safe and useful
	retryAfter time.Duration // the server's Retry-After, when > 0
}

// judgeResponse applies the retry table to a response.
func (t *Transport) judgeResponse(resp *http.Response, replayed bool) verdict {
	if replayed {
		return verdict{} // the stored response of a completed request: final
	}
	switch code := resp.StatusCode; {
	case code == http.StatusConflict:
		// The kit's 409 for a request in flight carries Retry-After; its
		// 409 for a completed request whose response was not stored
		// (ErrNotReplayable), like an application's own conflict, does not.
		if ra, ok := t.retryAfter(resp); ok {
			return verdict{retry: true, retryAfter: ra}
		}
		return verdict{}
	case code == http.StatusTooManyRequests, code == http.StatusServiceUnavailable,
		code == http.StatusRequestTimeout, code == http.StatusTooEarly,
		code >= 500 && code != http.StatusNotImplemented && code != http.StatusHTTPVersionNotSupported && code <= 599:
		ra, _ := t.retryAfter(resp)
		return verdict{retry: true, retryAfter: ra}
	}
	return verdict{}
}

// retryAfter parses resp's Retry-After: delta-seconds or an HTTP-date. ok
// is false when it is absent or malformed; a value of 0 or a date in the
// past gives ok and 0 (no wait beyond the backoff).
func (t *Transport) retryAfter(resp *http.Response) (d time.Duration, ok bool) {
	vs := resp.Header["Retry-After"]
	if len(vs) == 0 || vs[0] == "" {
		return 0, false
	}
	v := vs[0]
	if '0' <= v[0] && v[0] <= '9' {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			if !errors.Is(err, strconv.ErrRange) {
				return 0, false
			}
			s = uint64(maxRetryAfter / time.Second)
		}
		return time.Duration(min(s, uint64(maxRetryAfter/time.Second))) * time.Second, true
	}
	at, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return min(max(at.Sub(t.now()), 0), maxRetryAfter), true
}

// retryableError reports whether a request that failed with err (and no
// response) may be sent again: it may or may not have reached the server,
// and with its key a second execution is impossible. What cannot change
// by retrying is not retried: the request's context ended or its Cancel
// channel closed, the server's certificate was refused, the server does
// not speak TLS or refused the handshake, the host does not exist, or an
// https request reached a plain-HTTP server.
func retryableError(req *http.Request, err error) bool {
	//lint:ignore SA1019 a caller's deprecated Cancel channel is honoured as well as its context.
	if req.Context().Err() != nil || closed(req.Cancel) {
		return false
	}
	var (
		certErr   *tls.CertificateVerificationError
		authErr   x509.UnknownAuthorityError
		hostErr   x509.HostnameError
		invalErr  x509.CertificateInvalidError
		recordErr tls.RecordHeaderError
		alertErr  tls.AlertError
		dnsErr    *net.DNSError
	)
	switch {
	case errors.As(err, &certErr), errors.As(err, &authErr), errors.As(err, &hostErr),
		errors.As(err, &invalErr), errors.As(err, &recordErr), errors.As(err, &alertErr):
		return false
	case errors.As(err, &dnsErr) && dnsErr.IsNotFound:
		return false
	case errors.Is(err, http.ErrSchemeMismatch):
		return false
	}
	return true
}

// closed reports whether ch is closed (false for nil).
func closed(ch <-chan struct{}) bool {
	if ch == nil {
		return false
	}
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// wait returns how long to wait after attempt n: Retry-After plus up to a
// tenth of it (so that the clients told the same moment do not all come
// back at once), or the backoff with full jitter.
func (t *Transport) wait(n int, v verdict) time.Duration {
	if v.retryAfter > 0 {
		return v.retryAfter + t.jitter(v.retryAfter/10)
	}
	ceil := t.cfg.backoffMax
	if shift := n - 1; shift < 62 {
		if b := t.cfg.backoffBase << shift; b > 0 && b>>shift == t.cfg.backoffBase {
			ceil = min(ceil, b)
		}
	}
	return t.jitter(ceil)
}

// jitter returns a random duration in [0, d].
func (t *Transport) jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	if t.rand != nil {
		return t.rand(d)
	}
	return rand.N(d + 1)
}

// sleep waits for d, or until ctx ends or cancel (a request's deprecated
// Cancel channel) closes, and returns the context's error (or
// http's request-canceled error) in those cases.
func sleep(ctx context.Context, cancel <-chan struct{}, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d <= 0 {
		return nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-cancel:
		return errCanceled
	}
}

// errCanceled is returned when the request's Cancel channel closes during
// a wait, as http.Transport does.
var errCanceled = errors.New("net/http: request canceled")
