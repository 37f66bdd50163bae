package echoidem_test

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/echoidem"
	"github.com/idemkit/idem/storage/memstore"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
)

func Example() {
	store := memstore.New() // or redisstore.New(rdb) to share records between instances
	defer store.Close()
	m, err := idem.New(store)
	if err != nil {
		log.Fatal(err)
	}

	e := echo.New()
	// Inside Recover: a panic releases the key, then becomes a 500. A
	// logger goes first: e.Use(middleware.RequestLogger(), middleware.Recover(), ...).
	e.Use(middleware.Recover(), echoidem.Middleware(m))
	runs := 0
	e.POST("/charges", func(c echo.Context) error {
		runs++
		// A returned error is rendered inside the middleware, so this 402
		// is stored and replayed like any response.
		return echo.NewHTTPError(http.StatusPaymentRequired, "card declined")
	})

	srv := httptest.NewServer(e)
	defer srv.Close()
	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/charges", strings.NewReader(`{"amount":100}`))
		req.Header.Set("Idempotency-Key", "charge-1")
		res, err := srv.Client().Do(req)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		fmt.Printf("%d %s replayed=%q\n", res.StatusCode, strings.TrimSpace(string(body)), res.Header.Get("Idempotent-Replayed"))
	}
	fmt.Println("handler runs:", runs)
	// Output:
	// 402 {"message":"card declined"} replayed=""
	// 402 {"message":"card declined"} replayed="true"
	// handler runs: 1
}
