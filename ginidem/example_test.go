package ginidem_test

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/gin-gonic/gin"
	"github.com/idemkit/idem"
	"github.com/idemkit/idem/ginidem"
	"github.com/idemkit/idem/storage/memstore"
)

func Example() {
	store := memstore.New() // or redisstore.New(rdb) to share records between instances
	defer store.Close()
	m, err := idem.New(store)
	if err != nil {
		log.Fatal(err)
	}

	r := gin.New()
	// Inside Recovery: a panic releases the key, then becomes a 500. A
	// logger goes first: r.Use(gin.Logger(), gin.Recovery(), ...).
	r.Use(gin.Recovery(), ginidem.Middleware(m))
	runs := 0
	r.POST("/orders", func(c *gin.Context) {
		runs++
		c.JSON(http.StatusCreated, gin.H{"order": 42})
	})

	srv := httptest.NewServer(r)
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
