package pgstore_test

import (
	"context"
	"errors"
	"log"
	"net/http"
	"os"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A handler that creates an order and fences the request's entry in the
// same transaction: the order and the entry commit together, so a retry
// never creates a second order, even if the process dies right after the
// commit. It needs a server (DATABASE_URL), so it is not run.
func ExampleStore_Fence() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := pgstore.New(pool) // the table idem_keys, in the orders' database
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if err := store.CreateTable(ctx); err != nil { // or pgstore.Schema in a migration
		log.Fatal(err)
	}
	m, err := idem.New(store)
	if err != nil {
		log.Fatal(err)
	}

	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context() // carries the request's idem.Info, which Fence reads
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO orders (item) VALUES ($1)", r.FormValue("item")); err != nil {
				return err
			}
			// Last before COMMIT: the lease is checked as late as possible.
			// An error rolls the order back.
			return store.Fence(ctx, tx)
		})
		switch {
		case errors.Is(err, storage.ErrNotOwner):
			// This execution's lease ran out and another took the key:
			// nothing was committed.
			http.Error(w, "superseded by a retry", http.StatusConflict)
		case err != nil:
			http.Error(w, "could not create the order", http.StatusInternalServerError)
		default:
			w.WriteHeader(http.StatusCreated)
		}
	})
	log.Fatal(http.ListenAndServe(":8080", nethttp.Middleware(m)(mux)))
}
