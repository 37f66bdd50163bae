package nethttp_test

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage/memstore"
)

func Example() {
	store := memstore.New() // or redisstore.New(rdb) to share records between instances
	defer store.Close()
	m, err := idem.New(store)
	if err != nil {
		log.Fatal(err)
	}
	runs := 0
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		runs++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"order":42}`)
	})
	// Protect every route of the mux; the record is scoped by the matched
	// pattern ("POST /orders"). Or wrap single handlers:
	// mux.Handle("POST /orders", nethttp.Middleware(m)(h)).
	srv := httptest.NewServer(nethttp.Middleware(m)(mux))
	defer srv.Close()

	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"item":"book"}`))
		req.Header.Set("Idempotency-Key", "order-1")
		res, err := srv.Client().Do(req)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		fmt.Printf("%d %s replayed=%q\n", res.StatusCode, body, res.Header.Get("Idempotent-Replayed"))
	}
	fmt.Println("handler runs:", runs)
	// Output:
	// 201 {"order":42} replayed=""
	// 201 {"order":42} replayed="true"
	// handler runs: 1
}
