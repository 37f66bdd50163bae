package httprec_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"

	"github.com/idemkit/idem/internal/httprec"
	"github.com/idemkit/idem/response"
)

// A handler runs once through a Capture; its record is encoded for a store,
// and a retry gets the decoded record replayed.
func ExampleReplay() {
	handler := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", "/orders/42")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":42}`) // no Content-Type: the capture sniffs it as net/http would
	}

	// First request: tee the response to the client and keep a copy.
	first := httptest.NewRecorder()
	c := httprec.NewCapture(first, 1<<20, nil)
	handler(c, httptest.NewRequest(http.MethodPost, "/orders", nil))
	c.Finish()
	rec, ok := c.Record()
	if !ok {
		fmt.Println("response not replayable")
		return
	}
	stored, err := rec.MarshalBinary()
	if err != nil {
		fmt.Println(err)
		return
	}

	// A retry: decode what was stored and replay it.
	var again httprec.Record
	if err := again.UnmarshalBinary(stored); err != nil {
		fmt.Println(err)
		return
	}
	retry := httptest.NewRecorder()
	if err := httprec.Replay(retry, &again); err != nil {
		fmt.Println(err)
		return
	}
	res := retry.Result()
	fmt.Println(res.StatusCode, res.Header.Get("Location"), res.Header.Get("Content-Type"))
	fmt.Println(response.ReplayedHeader+":", res.Header.Get(response.ReplayedHeader))
	fmt.Println(retry.Body.String())
	// Output:
	// 201 /orders/42 text/plain; charset=utf-8
	// Idempotent-Replayed: true
	// {"id":42}
}
