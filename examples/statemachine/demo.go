package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/idemkit/idem/examples/democlient"
)

// demo is -demo's client against base: it creates a payment, captures it,
// retries the capture with the same key, captures it with another key and
// retries that, then shows the payment. It returns an error for an answer
// that is not the promised one.
func demo(out io.Writer, base string) error {
	answer, err := call(out, "a payment, pending", http.MethodPost, base+"/payments", "", `{"amount":1250}`)
	var id int64
	if err == nil {
		_, err = fmt.Sscanf(answer, "HTTP 201\n{\"payment\":%d,", &id)
	}
	if err != nil {
		return fmt.Errorf("creating a payment: %w: %s", err, answer)
	}
	url, run := fmt.Sprintf("%s/payments/%d", base, id), democlient.RunID()
	var errs []error
	for _, step := range []struct{ title, key, want string }{
		{"capture (key A): the transition runs", "capture-" + run + "-a", "HTTP 200\n"},
		{"the client retries (key A): idem replays the first answer", "capture-" + run + "-a", "HTTP 200  Idempotent-Replayed: true\n"},
		{"another request (key B): the state guard refuses, nothing changes", "capture-" + run + "-b", "HTTP 409\n"},
		{"that request retried (key B): its own answer, replayed", "capture-" + run + "-b", "HTTP 409  Idempotent-Replayed: true\n"},
		{"the payment now: captured once", "", `"state":"captured","amount":1250,"version":2}`},
	} {
		method, target := http.MethodPost, url+"/capture"
		if step.key == "" {
			method, target = http.MethodGet, url
		}
		answer, err := call(out, step.title, method, target, step.key, "")
		if err == nil && !strings.Contains(answer, step.want) {
			err = fmt.Errorf("%s: got %q, want %q", step.title, answer, step.want)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// call sends a request, with an Idempotency-Key unless key is "", writes
// the title and the answer to out, and returns the answer.
func call(out io.Writer, title, method, url, key, body string) (string, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	replayed := ""
	if res.Header.Get("Idempotent-Replayed") == "true" {
		replayed = "  Idempotent-Replayed: true"
	}
	answer := fmt.Sprintf("HTTP %d%s\n%s", res.StatusCode, replayed, b)
	fmt.Fprintf(out, "\n# %s\n%s", title, answer)
	return answer, err
}
