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

// maxBody bounds the body of a delivery: verified reads at most this much,
// and idem is given the same bound (WithMaxRequestBody).
const maxBody = 1 << 20

// A verifier checks that a delivery, whose complete body is body, was
// signed by its provider: nil when it was, else the reason, for the 401
// (it must not quote the request).
type verifier func(r *http.Request, body []byte) error

// errRefused is the Kind of the problems verified answers.
var errRefused = errors.New("webhook delivery refused before idem")

// verified passes a delivery on to next (idem's middleware, then the
// receiver), its body restored, only when verify accepts its signature;
// else it answers 401 and logs the refusal. It must stay outside idem: a
// forged delivery that reached idem would take the event's key. It reads
// at most maxBody bytes (413 past them).
func verified(provider string, verify verifier, logger *log.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			refuse(w, r, http.StatusRequestEntityTooLarge, fmt.Sprintf("The request body is larger than %d bytes.", maxBody))
			return
		} else if err != nil {
			refuse(w, r, http.StatusBadRequest, "The request body could not be read.")
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

// refuse answers status in idem's problem format (type about:blank).
func refuse(w http.ResponseWriter, r *http.Request, status int, detail string) {
	idem.WriteProblem(w, r, &idem.Error{Kind: errRefused, Status: status, Title: http.StatusText(status), Detail: detail})
}

// stripeTolerance bounds how far the timestamp of a Stripe-Signature may be
// from now, either way (Stripe's libraries use 5 minutes): an old delivery
// replayed is refused.
const stripeTolerance = 5 * time.Minute

// stripeSignature is the hex HMAC-SHA256 of "<t>.<body>": the v1 signature
// of Stripe-Signature: t=<unix seconds>,v1=<signature>, which has one v1 per
// active secret while a secret is rolled. Each delivery is signed anew.
func stripeSignature(secret []byte, t int64, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	fmt.Fprintf(mac, "%d.", t)
	mac.Write(body)
	return hex.EncodeToString(mac.Sum(nil))
}

// stripeVerifier checks Stripe-Signature against secret.
func stripeVerifier(secret []byte) verifier {
	return func(r *http.Request, body []byte) error {
		hs := r.Header.Values("Stripe-Signature")
		if len(hs) != 1 {
			return errors.New("one Stripe-Signature header is required")
		}
		var t int64 // 0 when missing or malformed: out of tolerance
		var sigs []string
		for part := range strings.SplitSeq(hs[0], ",") {
			switch k, v, _ := strings.Cut(part, "="); k {
			case "t":
				if n, err := strconv.ParseInt(v, 10, 64); err == nil {
					t = n
				}
			case "v1":
				sigs = append(sigs, v)
			}
		}
		if d := time.Since(time.Unix(t, 0)); d > stripeTolerance || d < -stripeTolerance {
			return fmt.Errorf("the Stripe-Signature timestamp is missing or more than %v away", stripeTolerance)
		}
		want := []byte(stripeSignature(secret, t, body))
		for _, sig := range sigs {
			if hmac.Equal([]byte(sig), want) {
				return nil
			}
		}
		return errors.New("no v1 signature matches")
	}
}

// Alipay signs a notification in its sign field, computed over the other
// fields sorted by name, as name=value joined by "&" (values unescaped,
// empty ones, sign and sign_type left out). Real notifications are signed
// with RSA2 (SHA256withRSA, verified with Alipay's public key, the
// signature in base64); this example uses HMAC-SHA256 with a shared key,
// in hex, to stay self-contained.
const alipaySignType = "HMAC-SHA256"

// alipaySignature is the hex signature of form.
func alipaySignature(key []byte, form url.Values) string {
	var names []string
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
		if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/x-www-form-urlencoded" {
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
		if !hmac.Equal([]byte(form.Get("sign")), []byte(alipaySignature(key, form))) {
			return errors.New("sign is missing or does not match")
		}
		return nil
	}
}

// githubSignature is the X-Hub-Signature-256 of body: sha256=<hex
// HMAC-SHA256 of the body>. Only the body is signed (not X-GitHub-Delivery),
// and without a timestamp.
func githubSignature(secret, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write(body)
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}

// githubVerifier checks X-Hub-Signature-256 against secret.
func githubVerifier(secret []byte) verifier {
	return func(r *http.Request, body []byte) error {
		hs := r.Header.Values("X-Hub-Signature-256")
		if len(hs) != 1 || !hmac.Equal([]byte(hs[0]), []byte(githubSignature(secret, body))) {
			return errors.New("X-Hub-Signature-256 is missing, sent twice or does not match")
		}
		return nil
	}
}
