package dynamostore_test

import (
	"context"
	"encoding/json"
	"log"
	"net/http"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/idemkit/idem"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage/dynamostore"
)

// An order endpoint on DynamoDB, with the credentials and region of the
// default chain (environment, shared config, the task's or function's
// role). It needs AWS, so it is not run.
func Example() {
	ctx := context.Background()
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		log.Fatal(err)
	}
	store, err := dynamostore.New(dynamodb.NewFromConfig(cfg), dynamostore.WithTable("orders_idem"))
	if err != nil {
		log.Fatal(err)
	}
	// A missing table, a wrong region or missing permissions: said here,
	// not as a 503 on every request.
	if err := store.Ping(ctx); err != nil {
		log.Fatal(err)
	}
	m, err := idem.New(store)
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(map[string]string{"id": "order-1"})
	})
	log.Fatal(http.ListenAndServe(":8080", nethttp.Middleware(m)(mux)))
}

// A table for tests and quick starts, on DynamoDB Local (or dynalite):
// CreateTable makes it (partition key "id", on-demand, TTL on "ttl")
// unless it exists, and waits until it is active.
func ExampleStore_CreateTable() {
	ctx := context.Background()
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		log.Fatal(err)
	}
	client := dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) {
		o.BaseEndpoint = aws.String("http://localhost:8000")
	})
	store, err := dynamostore.New(client)
	if err != nil {
		log.Fatal(err)
	}
	if err := store.CreateTable(ctx); err != nil {
		log.Fatal(err)
	}
}
