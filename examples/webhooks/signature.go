package main

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem"
)

// maxBody bounds the body of a delivery: the verifier reads at most this
// much, and idem is given the same bound (WithMaxRequestBody).
const maxBody = 1 << 20

// A verifier checks that a delivery was signed by its provider. It gets the
// request and its complete body and returns nil when the signature holds,
// else the reason, which goes into the 401 the sender gets: it must not
// quote the request.
type verifier func(r *http.Request, body []byte) error

// errRefused is the Kind of the problems the verifier answers: a
// delivery refused before idem saw it.
var errRefused = errors.New("webhook delivery refused before idem")

// verified returns the middleware that checks every delivery's signature
// before the handler it wraps (idem's middleware, and then the receiver)
// sees it: it reads the body (413 past maxBody), checks it with verify, and
// passes the request on with its body restored, or answers 401 with an
// application/problem+json body and logs the refusal to logger.
//
// It must stay outside idem: a request that idem sees takes its event's
// key (and a request that completes is replayed to every later delivery
// of that key for the TTL). A forged delivery that reached idem first
// would run the handler with the forger's data, or, if the handler
// refused it, store that refusal as the answer to the genuine event.
func verified(provider string, verify verifier, logger *log.Logger) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
			if err != nil {
				status, detail := http.StatusBadRequest, "The request body could not be read."
				if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
					status, detail = http.StatusRequestEntityTooLarge, fmt.Sprintf("The request body is larger than %d bytes.", maxBody)
				}
				refuse(w, r, status, detail)
				return
			}
			if err := verify(r, body); err != nil {
				logger.Printf("%s: refused before idem: %v", provider, err)
				refuse(w, r, http.StatusUnauthorized, "The delivery's signature does not verify: "+err.Error()+".")
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			next.ServeHTTP(w, r)
		})
	}
}

// refuse answers status with idem's problem format (type about:blank: the
// status says it all).
func refuse(w http.ResponseWriter, r *http.Request, status int, detail string) {
	idem.WriteProblem(w, r, &idem.Error{Kind: errRefused, Status: status, Title: http.StatusText(status), Detail: detail})
}

// Stripe: Stripe-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of
// "<t>.<body>">, with one v1 per active secret while a secret is rolled.
// Each delivery, a retry too, is signed anew with its own t.

// stripeSignature is the hex v1 signature of body sent at t.
func stripeSignature(secret []byte, t int64, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write(strconv.AppendInt(nil, t, 10))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return hex.EncodeToString(mac.Sum(nil))
}

// stripeVerifier checks Stripe-Signature against secret, and that its t is
// within tolerance of now (either way: a replayed delivery is too old, a
// clock too far off is refused too).
func stripeVerifier(secret []byte, tolerance time.Duration, now func() time.Time) verifier {
	return func(r *http.Request, body []byte) error {
		hs := r.Header.Values("Stripe-Signature")
		if len(hs) != 1 {
			return errors.New("one Stripe-Signature header is required")
		}
		var t int64 = -1
		var sigs [][]byte
		for part := range strings.SplitSeq(hs[0], ",") {
			k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
			switch k {
			case "t":
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil || n < 0 {
					return errors.New("the Stripe-Signature timestamp is malformed")
				}
				t = n
			case "v1":
				if sig, err := hex.DecodeString(v); err == nil {
					sigs = append(sigs, sig)
				}
			}
		}
		if t < 0 || len(sigs) == 0 {
			return errors.New("the Stripe-Signature header has no timestamp or no v1 signature")
		}
		if d := now().Sub(time.Unix(t, 0)); d > tolerance || d < -tolerance {
			return fmt.Errorf("the Stripe-Signature timestamp is more than %v away", tolerance)
		}
		want, _ := hex.DecodeString(stripeSignature(secret, t, body))
		for _, sig := range sigs {
			if hmac.Equal(sig, want) {
				return nil
			}
		}
		return errors.New("no v1 signature matches")
	}
}

// Alipay: a form whose sign is computed over the other fields, sorted by
// name, as name=value joined by "&" (values unescaped, empty ones and sign
// and sign_type left out). Real Alipay notifications are signed with RSA2
// (SHA256withRSA, Alipay's private key; the receiver verifies with
// Alipay's public key, base64 signature). This example uses HMAC-SHA256
// with a shared key, hex, to stay self-contained: the shape is the point,
// the algorithm is not.

// alipaySignType is the sign_type of this example's notifications.
const alipaySignType = "HMAC-SHA256"

// alipaySignature is the hex signature of form.
func alipaySignature(key []byte, form url.Values) string {
	names := make([]string, 0, len(form))
	for name, vs := range form {
		if name != "sign" && name != "sign_type" && len(vs) > 0 && vs[0] != "" {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	mac := hmac.New(sha256.New, key)
	for i, name := range names {
		if i > 0 {
			mac.Write([]byte{'&'})
		}
		mac.Write([]byte(name + "=" + form.Get(name)))
	}
	return hex.EncodeToString(mac.Sum(nil))
}

// alipayVerifier checks the sign field of a notification against key.
func alipayVerifier(key []byte) verifier {
	return func(r *http.Request, body []byte) error {
		if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/x-www-form-urlencoded" {
			return errors.New("the body is not a form")
		}
		form, err := url.ParseQuery(string(body))
		if err != nil {
			return errors.New("the form is malformed")
		}
		for _, vs := range form {
			if len(vs) > 1 {
				return errors.New("a form field is sent more than once") // which one would the signature cover?
			}
		}
		if form.Get("sign_type") != alipaySignType {
			return errors.New("sign_type is not " + alipaySignType)
		}
		sig, err := hex.DecodeString(form.Get("sign"))
		if err != nil || len(sig) == 0 {
			return errors.New("sign is missing or malformed")
		}
		want, _ := hex.DecodeString(alipaySignature(key, form))
		if !hmac.Equal(sig, want) {
			return errors.New("sign does not match")
		}
		return nil
	}
}

// GitHub: X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>. Only
// the body is signed, not the headers (X-GitHub-Delivery included), and
// there is no timestamp.

// githubSignature is the X-Hub-Signature-256 value of body.
func githubSignature(secret, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write(body)
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}

// githubVerifier checks X-Hub-Signature-256 against secret.
func githubVerifier(secret []byte) verifier {
	return func(r *http.Request, body []byte) error {
		hs := r.Header.Values("X-Hub-Signature-256")
		if len(hs) != 1 {
			return errors.New("one X-Hub-Signature-256 header is required")
		}
		hexSig, ok := strings.CutPrefix(hs[0], "sha256=")
		sig, err := hex.DecodeString(hexSig)
		if !ok || err != nil {
			return errors.New("X-Hub-Signature-256 is malformed")
		}
		want, _ := hex.DecodeString(strings.TrimPrefix(githubSignature(secret, body), "sha256="))
		if !hmac.Equal(sig, want) {
			return errors.New("X-Hub-Signature-256 does not match")
		}
		return nil
	}
}
