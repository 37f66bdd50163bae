package response_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/idemkit/idem/internal/leakcheck"
	"github.com/idemkit/idem/response"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

// wrapper is a middleware's writer that unwraps to the one it wraps.
type wrapper struct{ http.ResponseWriter }

func (w wrapper) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func TestInnermost(t *testing.T) {
	server := httptest.NewRecorder()
	for depth, w := range []http.ResponseWriter{server, wrapper{server}, wrapper{wrapper{wrapper{server}}}} {
		if got := response.Innermost(w); got != server {
			t.Errorf("depth %d: Innermost = %T, want the server's writer", depth, got)
		}
	}
}

// An adapter asks the server's own writer for a feature that a wrapper
// must not claim on its behalf.
func ExampleInnermost() {
	var w http.ResponseWriter = wrapper{httptest.NewRecorder()}
	_, pusher := response.Innermost(w).(http.Pusher)
	fmt.Println("the server's writer can push:", pusher)
	// Output: the server's writer can push: false
}
