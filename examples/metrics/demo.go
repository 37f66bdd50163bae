package main

// This file is the demo that -demo runs: an order and a duplicate of it
// sent while it runs, its retry, and then what GET /metrics says of them.

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// play sends to base an order (key order-RUN) twice at once, one of them
// turned away with 409 while the other runs, then its retry, which is
// replayed; then it prints idem's lines of GET /metrics, without the
// histograms' buckets. It returns an error for an answer that is not the
// promised one.
func play(out io.Writer, base, run string) error {
	key := "order-" + run
	type answer struct {
		status   int
		replayed bool
		err      error
	}
	answers := make(chan answer, 2)
	for range 2 {
		go func() {
			status, replayed, err := order(base, key)
			answers <- answer{status, replayed, err}
		}()
	}
	a, b := <-answers, <-answers
	if err := errors.Join(a.err, b.err); err != nil {
		return err
	}
	fmt.Fprintf(out, "# an order and a duplicate sent while it runs\nHTTP %d\nHTTP %d\n", a.status, b.status)
	if a.status+b.status != http.StatusCreated+http.StatusConflict {
		return fmt.Errorf("the order and its duplicate got %d and %d, want 201 and 409", a.status, b.status)
	}
	status, replayed, err := order(base, key)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "# the client retries the order\nHTTP %d  Idempotent-Replayed: %v\n", status, replayed)
	if status != http.StatusCreated || !replayed {
		return fmt.Errorf("the retry got %d (replayed %v), want a replayed 201", status, replayed)
	}

	res, err := http.Get(base + "/metrics")
	if err != nil {
		return err
	}
	defer res.Body.Close()
	fmt.Fprintf(out, "# GET /metrics: idem's series\n")
	lines := bufio.NewScanner(res.Body)
	for lines.Scan() {
		if line := lines.Text(); strings.HasPrefix(line, "idem_") && !strings.Contains(line, "_bucket{") {
			fmt.Fprintln(out, line)
		}
	}
	return lines.Err()
}

// order sends POST /orders?slow=1 with key (slow=1 makes democlient's
// Clicks hold the first request until its duplicate got 409) and returns
// the status and whether it was replayed.
func order(base, key string) (status int, replayed bool, err error) {
	req, err := http.NewRequest(http.MethodPost, base+"/orders?slow=1", strings.NewReader(`{"item":"book","amount":12}`))
	if err != nil {
		return 0, false, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, false, err
	}
	defer res.Body.Close()
	_, err = io.Copy(io.Discard, res.Body)
	return res.StatusCode, res.Header.Get("Idempotent-Replayed") == "true", err
}
