package sqlstore_test

import (
	"context"
	"database/sql"
	"log"
	"net/http"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage/sqlstore"
)

// A store on MySQL or MariaDB, and a handler that commits its order and
// the idempotency entry in one transaction.
func Example() {
	db, err := sql.Open("mysql", "app:secret@tcp(db:3306)/app") // import _ "github.com/go-sql-driver/mysql"
	if err != nil {
		log.Fatal(err)
	}
	store, err := sqlstore.New(db, sqlstore.MySQL)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if err := store.CreateTable(context.Background()); err != nil { // or a migration running sqlstore.Schema's text
		log.Fatal(err)
	}
	m, err := idem.New(store)
	if err != nil {
		log.Fatal(err)
	}
	http.Handle("POST /orders", nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := db.BeginTx(r.Context(), nil)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(r.Context(), "INSERT INTO orders (item) VALUES (?)", "book"); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		// Last before COMMIT: the entry commits with the order, or neither.
		if err := store.Fence(r.Context(), tx); err != nil {
			http.Error(w, err.Error(), http.StatusConflict)
			return
		}
		if err := tx.Commit(); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})))
}

// The same on PostgreSQL, through pgx's database/sql driver (or lib/pq's
// "postgres").
func Example_postgreSQL() {
	db, err := sql.Open("pgx", "postgres://app:secret@db/app") // import _ "github.com/jackc/pgx/v5/stdlib"
	if err != nil {
		log.Fatal(err)
	}
	store, err := sqlstore.New(db, sqlstore.PostgreSQL)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if err := store.CreateTable(context.Background()); err != nil { // or a migration running sqlstore.Schema(sqlstore.PostgreSQL, "")
		log.Fatal(err)
	}
	// Then as on MySQL: idem.New(store), and store.Fence(r.Context(), tx)
	// last in the handler's transaction.
}
