package recipes

import (
	"context"
	"database/sql"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/leakcheck"
	"github.com/idemkit/idem/internal/mysqltest"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/sqlstore"
	"github.com/jmoiron/sqlx"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// TestMain stops the MariaDB server the tests started and fails the run if
// a goroutine leaked (a lease heartbeat, the store's janitor).
func TestMain(m *testing.M) { leakcheck.Main(mysqltest.Wrap(m)) }

const ordersDDL = "CREATE TABLE orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, item VARCHAR(100) NOT NULL) ENGINE=InnoDB"

// freshDSN makes a database of its own on the test server and returns a
// DSN for it.
func freshDSN(t *testing.T) string {
	t.Helper()
	dsn := mysqltest.DSN(t)
	admin, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	name := mysqltest.Database(t, func(q string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := admin.ExecContext(ctx, q)
		return err
	})
	return mysqltest.WithDatabase(dsn, name)
}

// recipe is one recipe set up on a fresh database: its handler, its
// store, and a pool on the same database for the test's own checks.
type recipe struct {
	handler http.Handler
	store   *sqlstore.Store
	db      *sql.DB
}

func openGORM(t *testing.T, dsn string, cfg *gorm.Config) *gorm.DB {
	t.Helper()
	cfg.Logger = logger.Discard
	gdb, err := gorm.Open(gormmysql.Open(dsn), cfg)
	if err != nil {
		t.Fatal(err)
	}
	sqlDB, err := gdb.DB()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sqlDB.Close() })
	return gdb
}

func setupGORM(t *testing.T) recipe {
	dsn := freshDSN(t)
	gdb := openGORM(t, dsn, &gorm.Config{})
	store, err := openStoreGORM(context.Background(), gdb)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	db, _ := gdb.DB()
	return recipe{createOrderGORM(gdb, store), store, db}
}

func setupSQLX(t *testing.T) recipe {
	dsn := freshDSN(t)
	db, err := sqlx.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	store, err := sqlstore.New(db.DB, sqlstore.MySQL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	if err := store.CreateTable(context.Background()); err != nil {
		t.Fatal(err)
	}
	return recipe{createOrderSQLX(db, store), store, db.DB}
}

// TestRecipes runs each recipe through the middleware on MariaDB: a first
// request creates one order and its fence commits the entry in the same
// transaction; a retry is replayed without running the handler; a handler
// whose lease another execution took gets ErrNotOwner from the fence and
// rolls its order back.
func TestRecipes(t *testing.T) {
	for _, c := range []struct {
		name  string
		setup func(*testing.T) recipe
	}{{"GORM", setupGORM}, {"sqlx", setupSQLX}} {
		t.Run(c.name, func(t *testing.T) {
			rc := c.setup(t)
			ctx := context.Background()
			if _, err := rc.db.ExecContext(ctx, ordersDDL); err != nil {
				t.Fatal(err)
			}
			m, err := idem.New(rc.store, idem.WithTTL(time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			var (
				runs     atomic.Int64
				stolen   atomic.Bool // the next execution loses its lease before it runs the recipe
				keys     = make(chan string, 1)
				after    = make(chan storage.State, 1)
				afterErr = make(chan error, 1)
			)
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				l, ok := storage.LeaseFromContext(r.Context())
				if !ok {
					t.Error("no lease in the request's context")
				}
				keys <- l.Key
				if stolen.Load() {
					steal(t, rc, l.Key)
				}
				rc.handler.ServeHTTP(w, r)
				// The entry as the recipe left it, before the middleware stores the response.
				e, err := rc.store.Lookup(context.Background(), l.Key, false)
				after <- e.State
				afterErr <- err
			})
			srv := httptest.NewServer(nethttp.Middleware(m)(h))
			defer srv.Close()

			// The first request: one order, the entry committed by the fence.
			code, hdr, body := post(t, srv, "order-1", "book")
			if code != http.StatusCreated {
				t.Fatalf("first request: %d %s", code, body)
			}
			key := <-keys
			if st, err := <-after, <-afterErr; err != nil || st != storage.Committed {
				t.Fatalf("entry after the recipe: %v, %v; want committed", st, err)
			}
			if hdr.Get("Idempotent-Replayed") != "" {
				t.Fatal("the first response is marked replayed")
			}
			if n := orders(t, rc.db); n != 1 {
				t.Fatalf("%d orders after the first request, want 1", n)
			}
			if e, err := rc.store.Lookup(ctx, key, false); err != nil || (e.State != storage.Committed && e.State != storage.Done) {
				t.Fatalf("entry after the response: %+v, %v; want committed or done", e, err)
			}

			// Its retry: replayed, the handler not run again.
			code, hdr, body = post(t, srv, "order-1", "book")
			if code != http.StatusCreated || hdr.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("retry: %d %q %s, want the replayed 201", code, hdr.Get("Idempotent-Replayed"), body)
			}
			if n := runs.Load(); n != 1 {
				t.Fatalf("the handler ran %d times, want once", n)
			}
			if n := orders(t, rc.db); n != 1 {
				t.Fatalf("%d orders after the retry, want 1", n)
			}

			// A lost lease: the fence refuses, the order rolls back.
			stolen.Store(true)
			code, _, body = post(t, srv, "order-2", "pen")
			if code != http.StatusConflict || !strings.Contains(body, "handled elsewhere") {
				t.Fatalf("request whose lease was lost: %d %s, want the recipe's 409", code, body)
			}
			key = <-keys
			if st, err := <-after, <-afterErr; err != nil || st != storage.InFlight {
				t.Fatalf("entry after the refused fence: %v, %v; want the other owner's, in flight", st, err)
			}
			if n := orders(t, rc.db); n != 1 {
				t.Fatalf("%d orders after the refused fence, want 1 (rolled back)", n)
			}
			if e, err := rc.store.Lookup(ctx, key, false); err != nil || e.State != storage.InFlight {
				t.Fatalf("entry after the response: %+v, %v; want the other owner's, in flight", e, err)
			}
		})
	}
}

// TestGORMPrepareStmt: with GORM's PrepareStmt, a transaction's ConnPool is
// a *gorm.PreparedStmtTX, not a *sql.Tx: the recipe cannot fence, returns
// an error, and GORM rolls the order back.
func TestGORMPrepareStmt(t *testing.T) {
	dsn := freshDSN(t)
	// GORM v1.31's statement cache starts a goroutine that never stops unless
	// its TTL is the cache's "no eviction" one (10 years): with it, leakcheck
	// passes.
	gdb := openGORM(t, dsn, &gorm.Config{PrepareStmt: true, PrepareStmtTTL: 10 * 365 * 24 * time.Hour})
	ctx := context.Background()
	store, err := openStoreGORM(ctx, gdb)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	db, _ := gdb.DB()
	if _, err := db.ExecContext(ctx, ordersDDL); err != nil {
		t.Fatal(err)
	}
	m, err := idem.New(store, idem.WithTTL(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(nethttp.Middleware(m)(createOrderGORM(gdb, store)))
	defer srv.Close()
	if code, _, body := post(t, srv, "order-1", "book"); code != http.StatusInternalServerError {
		t.Fatalf("with PrepareStmt: %d %s, want 500", code, body)
	}
	if n := orders(t, db); n != 0 {
		t.Fatalf("%d orders, want 0 (rolled back)", n)
	}
	err = gdb.Transaction(func(tx *gorm.DB) error {
		if p, ok := tx.Statement.ConnPool.(*gorm.PreparedStmtTX); !ok {
			t.Errorf("ConnPool is a %T, want a *gorm.PreparedStmtTX", tx.Statement.ConnPool)
		} else if _, ok := p.Tx.(*sql.Tx); !ok {
			t.Errorf("PreparedStmtTX.Tx is a %T, want the *sql.Tx", p.Tx)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// steal makes key's execution lose its lease, as sqlstore's TestFenceStale
// does: its lease runs out, and another execution takes the key.
func steal(t *testing.T, rc recipe, key string) {
	t.Helper()
	ctx := context.Background()
	const us = int64(time.Hour / time.Microsecond)
	if _, err := rc.db.ExecContext(ctx, "UPDATE idem_keys SET expires = expires - ?, held_until = held_until - ? WHERE `key` = ?", us, us, []byte(key)); err != nil {
		t.Error(err)
		return
	}
	if res, err := rc.store.Acquire(ctx, key, "another-owner", "fp", time.Minute); err != nil || res.State != storage.Acquired {
		t.Errorf("the other execution's Acquire: %+v, %v", res, err)
	}
}

func post(t *testing.T, srv *httptest.Server, key, item string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(url.Values{"item": {item}}.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Idempotency-Key", `"`+key+`"`)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

func orders(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM orders").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestManualMatches: the manual's GORM and sqlx blocks are this package's
// code, word for word.
func TestManualMatches(t *testing.T) {
	manual, err := os.ReadFile("../../../docs/manual.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("recipes.go")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```go\n(.*?)```").FindAllSubmatch(manual, -1)
	for _, fn := range []string{"func createOrderGORM(", "func openStoreGORM(", "func createOrderSQLX("} {
		found := false
		for _, b := range blocks {
			if !strings.Contains(string(b[1]), fn) {
				continue
			}
			found = true
			if !strings.Contains(string(src), string(b[1])) {
				t.Errorf("the manual's block of %s is not recipes.go's text:\n%s", fn, b[1])
			}
		}
		if !found {
			t.Errorf("the manual has no block with %s", fn)
		}
	}
}
