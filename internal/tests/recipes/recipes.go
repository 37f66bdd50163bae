// Package recipes holds the manual's recipes for fencing a transaction of
// GORM and of sqlx with storage/sqlstore (docs/manual.md, "Exactly once
// with your database (MySQL, MariaDB and database/sql)"), as the manual
// shows them: its test checks that the manual's blocks are this file's
// text, and runs each recipe on MariaDB through the middleware.
package recipes

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"

	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/sqlstore"
	"github.com/jmoiron/sqlx"
	"gorm.io/gorm"
)

type Order struct {
	ID   int64
	Item string
}

func createOrderGORM(gdb *gorm.DB, store *sqlstore.Store) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		err := gdb.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			if err := tx.Create(&Order{Item: r.FormValue("item")}).Error; err != nil {
				return err
			}
			sqlTx, ok := tx.Statement.ConnPool.(*sql.Tx)
			if !ok { // with gorm.Config{PrepareStmt: true}, a *gorm.PreparedStmtTX
				return fmt.Errorf("cannot fence a %T", tx.Statement.ConnPool)
			}
			return store.Fence(ctx, sqlTx) // last: GORM commits when this returns nil, rolls back otherwise
		})
		if errors.Is(err, storage.ErrNotOwner) {
			http.Error(w, "this request is being handled elsewhere", http.StatusConflict)
			return
		} else if err != nil {
			http.Error(w, "cannot create the order", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}
}

func openStoreGORM(ctx context.Context, gdb *gorm.DB) (*sqlstore.Store, error) {
	sqlDB, err := gdb.DB() // GORM's pool: the store's table is in the orders' database
	if err != nil {
		return nil, err
	}
	store, err := sqlstore.New(sqlDB, sqlstore.MySQL)
	if err != nil {
		return nil, err
	}
	return store, store.CreateTable(ctx)
}

func createOrderSQLX(db *sqlx.DB, store *sqlstore.Store) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		tx, err := db.BeginTxx(ctx, nil)
		if err != nil {
			http.Error(w, "database unavailable", http.StatusServiceUnavailable)
			return
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, "INSERT INTO orders (item) VALUES (?)", r.FormValue("item")); err != nil {
			http.Error(w, "cannot create the order", http.StatusInternalServerError)
			return
		}
		if err := store.Fence(ctx, tx.Tx); errors.Is(err, storage.ErrNotOwner) { // a *sqlx.Tx embeds its *sql.Tx
			http.Error(w, "this request is being handled elsewhere", http.StatusConflict)
			return
		} else if err != nil {
			http.Error(w, "cannot create the order", http.StatusInternalServerError)
			return
		}
		if err := tx.Commit(); err != nil {
			http.Error(w, "cannot create the order", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}
}
