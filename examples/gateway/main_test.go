package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/idemkit/idem/storage/memstore"
)

// TestGateway: a keyed POST reaches the upstream once, its retry is
// replayed by the gateway, a request without key and a GET pass through,
// and an upstream failure (502) is not stored.
func TestGateway(t *testing.T) {
	up := httptest.NewServer(countingUpstream())
	defer up.Close()
	target, _ := url.Parse(up.URL)
	store := memstore.New()
	defer store.Close()
	h, _, err := newGateway(store, target)
	if err != nil {
		t.Fatal(err)
	}
	gw := httptest.NewServer(h)
	defer gw.Close()

	send := func(method, base, key string) (int, string, string) {
		t.Helper()
		req, _ := http.NewRequest(method, base+"/orders", strings.NewReader(`{"item":"book"}`))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, res.Header.Get("Idempotent-Replayed"), string(b)
	}
	want := func(gotStatus int, gotReplayed, gotBody string, status int, replayed, body string) {
		t.Helper()
		if gotStatus != status || gotReplayed != replayed || gotBody != body {
			t.Fatalf("got %d replayed=%q %q, want %d replayed=%q %q", gotStatus, gotReplayed, gotBody, status, replayed, body)
		}
	}
	first := `{"upstream_requests":1,"path":"/orders"}` + "\n"
	s, r, b := send("POST", gw.URL, "k1")
	want(s, r, b, 201, "", first)
	s, r, b = send("POST", gw.URL, "k1")
	want(s, r, b, 201, "true", first)
	s, r, b = send("POST", gw.URL, "")
	want(s, r, b, 201, "", `{"upstream_requests":2,"path":"/orders"}`+"\n")
	s, r, b = send("GET", gw.URL, "k1")
	want(s, r, b, 201, "", `{"upstream_requests":3,"path":"/orders"}`+"\n")

	// The upstream goes away: 502, released, and the retry reaches the
	// upstream again once it is back.
	up.Close()
	if s, _, _ := send("POST", gw.URL, "k2"); s != http.StatusBadGateway {
		t.Fatalf("upstream down: %d, want 502", s)
	}
	up2 := httptest.NewServer(countingUpstream())
	defer up2.Close()
	target2, _ := url.Parse(up2.URL)
	h2, _, err := newGateway(store, target2) // same store, new upstream address
	if err != nil {
		t.Fatal(err)
	}
	gw2 := httptest.NewServer(h2)
	defer gw2.Close()
	s, r, b = send("POST", gw2.URL, "k2")
	want(s, r, b, 201, "", first)
}
