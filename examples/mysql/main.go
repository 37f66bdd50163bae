// Command mysql is an order service on MySQL or MariaDB that creates each
// order exactly once per Idempotency-Key, even when the process dies
// between committing the order and storing its response.
//
//	go run ./examples/mysql -mysql 'user:password@tcp(localhost:3306)/shop'        # serve on localhost:8080
//	go run ./examples/mysql -mysql 'user:password@tcp(localhost:3306)/shop' -demo  # run a scripted client against it, then exit
//
// -mysql is a github.com/go-sql-driver/mysql DSN that names a database,
// and defaults to $IDEM_MYSQL_DSN. The service reads DATETIME columns as
// UTC times: it sets parseTime=true and loc=UTC, whatever the DSN says.
// At start it creates idem's table (idem_keys) and the orders table
// unless they exist: the database user needs CREATE on the database, or a
// migration makes them (sqlstore.Schema, ordersSchema below). The tables
// are InnoDB (MySQL 8.0 and later, MariaDB 10.6 and later).
//
//	POST /orders   {"item":"book","amount":12}, with an Idempotency-Key (required)
//	-> 201 {"order":1,"item":"book","amount":12,"created_at":"2025-06-01T10:00:00.123456Z"}, Location: /orders/1
//	GET /orders/1  -> 200, the same body
//
// idem keeps its entries in the same database (storage/sqlstore). The
// handler inserts the order and calls store.Fence(ctx, tx) in the same
// transaction, last before COMMIT: the order, and idem's mark that the
// key's request committed, exist together or not at all. An execution that
// lost its lease cannot commit (Fence: storage.ErrNotOwner; 409, nothing
// changed). A retry after the process died between COMMIT and storing the
// response is answered by idem.WithRebuild from the order's row, found by
// the request's idem.Info.StorageKey in a UNIQUE column: the original 201,
// byte for byte (the body is the row's columns; its time is written by the
// server in UTC, UTC_TIMESTAMP(6), and read as UTC). The UNIQUE column
// also refuses a second order once idem has forgotten the key (409).
//
// Effects outside this database (an e-mail, a payment provider) are not in
// the transaction: give each an idempotency key of its own, or an outbox
// table. See docs/manual.md, "Exactly once with your database".
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/democlient"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/response"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/sqlstore"
)

// config is what run needs: the flags, and the tables (the tests' own).
type config struct {
	addr, dsn     string
	table, orders string // idem's table, the orders table
	demo          bool
}

func main() {
	log.SetFlags(0)
	c := config{table: sqlstore.DefaultTable, orders: "orders"}
	flag.StringVar(&c.addr, "addr", "localhost:8080", "listen address")
	flag.StringVar(&c.dsn, "mysql", "", "MySQL or MariaDB DSN (go-sql-driver/mysql's), such as 'user:password@tcp(localhost:3306)/shop' (default $IDEM_MYSQL_DSN)")
	flag.BoolVar(&c.demo, "demo", false, "serve on a free port, run a scripted client against it, and exit")
	flag.Parse()
	if c.dsn == "" {
		c.dsn = os.Getenv("IDEM_MYSQL_DSN") // not the flag's default: -help would print the password
	}
	if err := run(c, os.Stdout, os.Stderr); err != nil {
		log.Fatal(err)
	}
}

// run serves until SIGINT or SIGTERM (with c.demo, on a free port while
// the scripted client writes its transcript to out), logging idem's
// decisions and the database's errors to logw, then shuts down in the
// order a deploy needs: the server, the middleware, the store and its pool.
func run(c config, out, logw io.Writer) error {
	if c.dsn == "" {
		return errors.New("no database: give -mysql 'user:password@tcp(host:3306)/dbname', or set IDEM_MYSQL_DSN")
	}
	db, err := openDB(c.dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := open(ctx, db, c.table, c.orders, democlient.NewClicks(), log.New(logw, "", 0))
	if err != nil {
		return err
	}
	defer s.store.Close()
	m, err := idem.New(s.store, s.options()...)
	if err != nil {
		return err
	}
	if c.demo {
		c.addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", c.addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: s.routes(m), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	var failed error
	if c.demo {
		failed = demo(out, "http://"+ln.Addr().String(), db, c.orders)
	} else {
		log.Printf("listening on http://%s; try:\n  curl -i -X POST http://%[1]s/orders -H 'Content-Type: application/json' -H 'Idempotency-Key: order-1' -d '{\"item\":\"book\",\"amount\":12}'", ln.Addr())
		sig, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		<-sig.Done()
		stop()
	}
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return errors.Join(failed, srv.Shutdown(ctx), m.Shutdown(ctx))
}

// openDB returns a pool on the DSN's database, reading DATETIME columns
// as UTC times (parseTime=true, loc=UTC). It connects to nothing yet.
func openDB(dsn string) (*sql.DB, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		// The driver's errors do not quote the DSN, or its password.
		return nil, fmt.Errorf("-mysql: not a DSN that go-sql-driver/mysql accepts (user:password@tcp(host:3306)/dbname): %w", err)
	}
	if cfg.DBName == "" {
		return nil, errors.New("-mysql: the DSN names no database: user:password@tcp(host:3306)/dbname")
	}
	cfg.ParseTime, cfg.Loc = true, time.UTC
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("-mysql: %w", err)
	}
	db := sql.OpenDB(conn)
	db.SetMaxIdleConns(16)                 // database/sql keeps 2 by default: a burst would reconnect
	db.SetConnMaxLifetime(3 * time.Minute) // before a server's or a proxy's idle timeout
	return db, nil
}

// ordersSchema is the orders table, for fmt with its quoted name. idem_key
// is the idem.Info.StorageKey of the request that created the order (a
// hash of the principal's scope, the method, the route and the key):
// UNIQUE, one order per key even once idem has forgotten the key, and
// WithRebuild finds the order by it. idempotency_key is the client's key,
// for people reading the table: two principals may choose the same one.
// created_at is the server's UTC_TIMESTAMP(6), a UTC time without a zone
// (DATETIME: no session time zone converts it). utf8mb4_bin: an item is
// kept as sent, byte for byte, whatever the server's default character set.
const ordersSchema = `CREATE TABLE IF NOT EXISTS %s (
    id              BIGINT         NOT NULL AUTO_INCREMENT PRIMARY KEY,
    item            VARCHAR(200)   NOT NULL,
    amount          INT            NOT NULL,
    created_at      DATETIME(6)    NOT NULL,
    idem_key        VARBINARY(255) NULL UNIQUE,
    idempotency_key VARCHAR(255)   NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin`

// cols are the columns of an order, as scan reads them.
const cols = "id, item, amount, created_at"

// service is the order service, on one database for the orders and idem.
type service struct {
	db     *sql.DB
	store  *sqlstore.Store
	orders string             // the orders table, quoted for SQL
	clicks *democlient.Clicks // the demo's double click (package democlient); a copied service drops it
	log    *log.Logger        // idem's decisions and the database's errors
}

// open makes the service, with idem's entries in table and the orders in
// orders, and creates both tables unless they exist (CREATE TABLE IF NOT
// EXISTS is one statement: instances starting together do not trip over
// each other).
func open(ctx context.Context, db *sql.DB, table, orders string, clicks *democlient.Clicks, logger *log.Logger) (*service, error) {
	if table == orders {
		return nil, fmt.Errorf("idem's table and the orders table are both %q", orders)
	}
	store, err := sqlstore.New(db, sqlstore.MySQL, sqlstore.WithTable(table))
	if err != nil {
		return nil, err
	}
	s := &service{db: db, store: store, orders: quote(orders), clicks: clicks, log: logger}
	if err = store.CreateTable(ctx); err == nil {
		_, err = db.ExecContext(ctx, fmt.Sprintf(ordersSchema, s.orders))
	}
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("creating the tables: %w", err)
	}
	return s, nil
}

// quote quotes a table name for MySQL.
func quote(name string) string { return "`" + strings.ReplaceAll(name, "`", "``") + "`" }

// options are the middleware's options for this service.
func (s *service) options() []idem.Option {
	return []idem.Option{
		idem.WithRequireKey(),       // every order has a key, for its retries: none, 400
		idem.WithRebuild(s.rebuild), // committed, response not stored: answered from the row
		idem.WithObserver(func(ev idem.Event) {
			s.log.Printf("idem: %s %s -> %s %d (%v)", ev.Method, ev.Route, ev.Outcome, ev.Status, ev.Duration.Round(time.Microsecond))
		}),
		idem.WithErrorWriter(s.clicks.WriteError), // idem.WriteProblem, and the demo's double click
	}
}

// routes serves POST /orders behind m, and GET /orders/{id}.
func (s *service) routes(m *idem.Middleware) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /orders", nethttp.Middleware(m)(http.HandlerFunc(s.create)))
	mux.HandleFunc("GET /orders/{id}", s.get)
	return mux
}

// errExists: the key has an order already, made by another execution.
var errExists = errors.New("an order exists for this idempotency key")

// create is POST /orders.
func (s *service) create(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Item   string `json:"item"`
		Amount int    `json:"amount"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		fail(w, r, http.StatusBadRequest, "The body is not a JSON order: "+err.Error()+".", 0)
		return
	}
	if in.Item == "" || len(in.Item) > 200 || in.Amount < 1 || in.Amount > 1_000_000 {
		fail(w, r, http.StatusUnprocessableEntity, "An order has an item of 1 to 200 bytes and an amount from 1 to 1000000.", 0)
		return
	}
	s.clicks.Hold(r) // ?slow=1 waits for its duplicate's 409 (democlient)
	o, err := s.insert(r.Context(), in.Item, in.Amount)
	switch {
	case errors.Is(err, storage.ErrNotOwner):
		// This execution lost its lease; another holds the key. Nothing
		// was committed: the client's retry gets the other's answer.
		idem.WriteProblem(w, r, &idem.Error{Kind: idem.ErrConflict, Status: http.StatusConflict, Title: "Request in progress",
			Detail: "Another execution of this request holds its idempotency key; this one changed nothing. Retry to get its result.", RetryAfter: time.Second})
	case errors.Is(err, errExists):
		// Committed by an execution that took the key from this one, or
		// before idem forgot the key (its TTL).
		fail(w, r, http.StatusConflict, "An order was already created with this idempotency key.", 0)
	case err != nil:
		// A 5xx is not stored: idem releases the key and a retry runs the
		// handler again, unless the fence committed (a COMMIT whose answer
		// was lost): then WithRebuild answers it.
		s.log.Printf("POST /orders: %v", err)
		fail(w, r, http.StatusServiceUnavailable, "The order could not be saved now. Retry with the same Idempotency-Key.", time.Second)
	default:
		writeOrder(w, http.StatusCreated, o)
	}
}

// erDupEntry is MySQL's error for a duplicate value of a UNIQUE key.
const erDupEntry = 1062

// insert inserts the order and fences idem's entry in one transaction:
// the Fence last before COMMIT, so that the lease is checked as late as
// possible and the entry locked for the shortest time. ctx is the
// request's: it carries the lease that Fence checks, and a client that
// goes away cancels the transaction (database/sql rolls it back).
func (s *service) insert(ctx context.Context, item string, amount int) (order, error) {
	info, _ := idem.FromContext(ctx)
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return order{}, err
	}
	defer tx.Rollback() // unless committed
	// When the key has an order, committed or committing (the INSERT waits
	// for that transaction), error 1062. NULLIF: a request idem does not
	// protect (none here: WithRequireKey) has no key.
	res, err := tx.ExecContext(ctx, "INSERT INTO "+s.orders+" (item, amount, created_at, idem_key, idempotency_key)\n"+
		"VALUES (?, ?, UTC_TIMESTAMP(6), NULLIF(?, ''), NULLIF(?, ''))", item, amount, info.StorageKey, info.Key)
	if myErr, ok := errors.AsType[*mysql.MySQLError](err); ok && myErr.Number == erDupEntry {
		return order{}, errExists
	}
	if err != nil {
		return order{}, err
	}
	id, err := res.LastInsertId()
	if err != nil {
		return order{}, err
	}
	// The row as the table holds it: the response is made of what a
	// rebuild reads, created_at to the microsecond.
	o, err := scan(tx.QueryRowContext(ctx, "SELECT "+cols+" FROM "+s.orders+" WHERE id = ?", id))
	if err != nil {
		return order{}, err
	}
	if err := s.store.Fence(ctx, tx); err != nil {
		return order{}, err // wraps storage.ErrNotOwner when the lease was lost
	}
	return o, tx.Commit()
}

// rebuild is WithRebuild's function: a retry of a request whose order
// committed but whose response was not stored gets the order's 201 from
// its row. Without a row it returns false (idem's 409 ErrNotReplayable);
// when the database fails it answers 503, which a client retries.
func (s *service) rebuild(w http.ResponseWriter, r *http.Request) bool {
	info, _ := idem.FromContext(r.Context())
	o, err := scan(s.db.QueryRowContext(r.Context(), "SELECT "+cols+" FROM "+s.orders+" WHERE idem_key = ?", info.StorageKey))
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return false
	case err != nil:
		s.log.Printf("POST /orders, rebuilding a response: %v", err)
		w.Header().Del(response.ReplayedHeader) // an error, not a replay
		fail(w, r, http.StatusServiceUnavailable, "The order could not be read now. Retry with the same Idempotency-Key.", time.Second)
	default:
		writeOrder(w, http.StatusCreated, o)
	}
	return true
}

// get is GET /orders/{id}.
func (s *service) get(w http.ResponseWriter, r *http.Request) {
	id, _ := strconv.ParseInt(r.PathValue("id"), 10, 64)
	o, err := scan(s.db.QueryRowContext(r.Context(), "SELECT "+cols+" FROM "+s.orders+" WHERE id = ?", id))
	switch {
	case errors.Is(err, sql.ErrNoRows):
		fail(w, r, http.StatusNotFound, "No such order.", 0)
	case err != nil:
		s.log.Printf("GET /orders/%d: %v", id, err)
		fail(w, r, http.StatusServiceUnavailable, "The order could not be read now.", time.Second)
	default:
		writeOrder(w, http.StatusOK, o)
	}
}

// order is an order's row, and the API's view of it: a response made of
// the row's columns only is rebuilt from the row byte for byte.
type order struct {
	ID        int64     `json:"order"`
	Item      string    `json:"item"`
	Amount    int       `json:"amount"`
	CreatedAt time.Time `json:"created_at"`
}

func scan(row *sql.Row) (order, error) {
	var o order
	err := row.Scan(&o.ID, &o.Item, &o.Amount, &o.CreatedAt)
	o.CreatedAt = o.CreatedAt.UTC() // loc=UTC: already; the same bytes whatever the instance's zone
	return o, err
}

// writeOrder answers with o; a 201 (created, or rebuilt) has its Location.
func writeOrder(w http.ResponseWriter, status int, o order) {
	body, _ := json.Marshal(o) // cannot fail
	w.Header().Set("Content-Type", "application/json")
	if status == http.StatusCreated {
		w.Header().Set("Location", "/orders/"+strconv.FormatInt(o.ID, 10))
	}
	w.WriteHeader(status)
	w.Write(append(body, '\n'))
}

// errService is the Kind of the service's own problems.
var errService = errors.New("order service")

// fail answers with an RFC 9457 problem, written as idem writes its own.
func fail(w http.ResponseWriter, r *http.Request, status int, detail string, retryAfter time.Duration) {
	idem.WriteProblem(w, r, &idem.Error{Kind: errService, Status: status, Title: http.StatusText(status), Detail: detail, RetryAfter: retryAfter})
}
