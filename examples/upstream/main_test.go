package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The service places an order for every POST, retries included: what the
// gateway protects it from.
func TestService(t *testing.T) {
	srv := httptest.NewServer(newService())
	defer srv.Close()
	for i, want := range []string{`{"id":1,"request":{"item":"book"}}`, `{"id":2,"request":{"item":"book"}}`} {
		res, err := http.Post(srv.URL+"/orders", "application/json", strings.NewReader(`{"item":"book"}`))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusCreated || strings.TrimSpace(string(b)) != want {
			t.Fatalf("POST %d: %d %s", i, res.StatusCode, b)
		}
	}
	res, err := http.Post(srv.URL+"/orders", "application/json", strings.NewReader(`not json`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusBadRequest {
		t.Fatalf("bad body: %d", res.StatusCode)
	}
}
