package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/tests/pgxtest"
)

// The tests run the service on a real PostgreSQL (internal/pgtest), each
// on tables of its own.

// TestDemo runs what `go run ./examples/statemachine -pg ... -demo` runs.
func TestDemo(t *testing.T) {
	pool := pgxtest.Pool(t)
	c := config{dsn: pgtest.DSN(t), table: pgxtest.Table(t, pool), payments: pgxtest.Table(t, pool), demo: true}
	var out strings.Builder
	if err := run(c, &out, io.Discard); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	got := out.String()
	for _, want := range []string{
		"# capture (key A): the transition runs\nHTTP 200\n{\"payment\":",
		"# the client retries (key A): idem replays the first answer\nHTTP 200  Idempotent-Replayed: true\n",
		"# another request (key B): the state guard refuses, nothing changes\nHTTP 409\n",
		"# that request retried (key B): its own answer, replayed\nHTTP 409  Idempotent-Replayed: true\n",
		"# the payment now: captured once\nHTTP 200\n",
		`"state":"captured","amount":1250,"version":2}`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the transcript does not show %q:\n%s", want, got)
		}
	}
}

// server runs the service on tables of its own.
func server(t *testing.T) (*service, string) {
	t.Helper()
	pool := pgxtest.Pool(t)
	s, err := open(context.Background(), pool, pgxtest.Table(t, pool), pgxtest.Table(t, pool), log.New(io.Discard, "", 0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.store.Close() })
	m, err := idem.New(s.store)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.routes(m))
	t.Cleanup(srv.Close)
	return s, srv.URL
}

type answer struct {
	status   int
	replayed bool
	body     string
}

func post(t *testing.T, url, key, body string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Error(err)
		return answer{}
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return answer{}
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return answer{res.StatusCode, res.Header.Get("Idempotent-Replayed") == "true", string(b)}
}

// TestCaptureOnce: captures sent at once, each with a key of its own,
// capture the payment once: one key's answer is 200 captured, every other
// key's 409 (the state guard). Each key sent again gets its first answer
// replayed; the row is captured, at version 2.
func TestCaptureOnce(t *testing.T) {
	s, base := server(t)
	created := post(t, base+"/payments", "", `{"amount":990}`)
	if created.status != http.StatusCreated {
		t.Fatalf("create: %+v", created)
	}
	const keys = 12
	capture := base + "/payments/1/capture"
	first := make([]answer, keys)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range keys {
		wg.Go(func() {
			<-start
			first[i] = post(t, capture, fmt.Sprintf("k%d", i), "")
		})
	}
	close(start)
	wg.Wait()
	captured := 0
	for i, a := range first {
		switch {
		case a.status == http.StatusOK && strings.Contains(a.body, `"state":"captured"`) && !a.replayed:
			captured++
		case a.status == http.StatusConflict && !a.replayed:
		default:
			t.Errorf("key %d: %+v, want 200 captured or 409", i, a)
		}
		if again := post(t, capture, fmt.Sprintf("k%d", i), ""); again.status != a.status || again.body != a.body || !again.replayed {
			t.Errorf("key %d sent again: %+v, want %+v replayed", i, again, a)
		}
	}
	if captured != 1 {
		t.Fatalf("%d captures answered 200, want 1", captured)
	}
	var state string
	var version int
	if err := s.pool.QueryRow(context.Background(), "SELECT state, version FROM "+s.payments+" WHERE id = 1").Scan(&state, &version); err != nil || state != "captured" || version != 2 {
		t.Fatalf("the payment: %s, version %d (%v); want captured, version 2", state, version, err)
	}
}

// TestCaptureUnknownPayment: a capture of no payment gets 404.
func TestCaptureUnknownPayment(t *testing.T) {
	_, base := server(t)
	if a := post(t, base+"/payments/7/capture", "k", ""); a.status != http.StatusNotFound {
		t.Fatalf("%+v, want 404", a)
	}
}
