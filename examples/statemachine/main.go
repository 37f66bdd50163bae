// Command statemachine is a payment service on PostgreSQL whose capture is
// a state transition guarded in SQL, behind idem: the state-machine (or
// optimistic-lock) technique, and what idem adds to it.
//
//	go run ./examples/statemachine -pg 'postgres://user:password@localhost:5432/shop'        # serve on localhost:8080
//	go run ./examples/statemachine -pg 'postgres://user:password@localhost:5432/shop' -demo  # run a scripted client, then exit
//
// -pg defaults to $IDEM_PG_DSN. At start it creates idem's table
// (idem_keys) and the payments table unless they exist.
//
//	POST /payments            {"amount":1250}         -> 201 {"payment":1,"state":"pending","amount":1250,"version":1}
//	POST /payments/1/capture  with an Idempotency-Key -> 200 {"payment":1,"state":"captured","amount":1250,"version":2}
//	GET  /payments/1          -> 200, the payment as it is
//
// The capture is one statement that moves the payment from pending to
// captured, and only from pending:
//
//	UPDATE payments SET state = 'captured', version = version + 1
//	WHERE id = $1 AND state = 'pending' RETURNING ...
//
// Whatever the requests and their keys, a payment is captured at most
// once: a second UPDATE finds no pending row. What the guard cannot do is
// answer a retry: the client whose first attempt timed out hears "not
// pending any more", and cannot tell whether its attempt captured the
// payment. idem in front, its fence in the UPDATE's transaction, gives
// that retry the first answer, byte for byte; a request with another key
// reaches the guard and gets 409. See docs/manual.md, "State machines and
// optimistic locks, behind idem".
package main

import (
	"context"
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
	"syscall"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// config is what run needs: the flags, and the tables (the tests' own).
type config struct {
	addr, dsn       string
	table, payments string // idem's table, the payments table
	demo            bool
}

func main() {
	log.SetFlags(0)
	c := config{table: pgstore.DefaultTable, payments: "payments"}
	flag.StringVar(&c.addr, "addr", "localhost:8080", "listen address")
	flag.StringVar(&c.dsn, "pg", "", "PostgreSQL connection string, such as 'postgres://user:password@localhost:5432/shop' (default $IDEM_PG_DSN)")
	flag.BoolVar(&c.demo, "demo", false, "serve on a free port, run a scripted client against it, and exit")
	flag.Parse()
	if c.dsn == "" {
		c.dsn = os.Getenv("IDEM_PG_DSN") // not the flag's default: -help would print the password
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
		return errors.New("no database: give -pg 'postgres://user:password@host:5432/dbname', or set IDEM_PG_DSN")
	}
	pool, err := pgxpool.New(context.Background(), c.dsn)
	if err != nil {
		return fmt.Errorf("-pg: %w", err)
	}
	defer pool.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := open(ctx, pool, c.table, c.payments, log.New(logw, "", 0))
	if err != nil {
		return err
	}
	defer s.store.Close()
	m, err := idem.New(s.store, idem.WithObserver(func(ev idem.Event) {
		s.log.Printf("idem: %s %s -> %s %d (%v)", ev.Method, ev.Route, ev.Outcome, ev.Status, ev.Duration.Round(time.Microsecond))
	}))
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
		failed = demo(out, "http://"+ln.Addr().String())
	} else {
		log.Printf("listening on http://%s; try:\n  curl -i -X POST http://%[1]s/payments -H 'Content-Type: application/json' -d '{\"amount\":1250}'\n"+
			"  curl -i -X POST http://%[1]s/payments/1/capture -H 'Idempotency-Key: capture-1'", ln.Addr())
		sig, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		<-sig.Done()
		stop()
	}
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return errors.Join(failed, srv.Shutdown(ctx), m.Shutdown(ctx))
}

// paymentsSchema is the payments table, for fmt with its quoted name.
const paymentsSchema = `CREATE TABLE IF NOT EXISTS %s (
    id      bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    amount  integer NOT NULL CHECK (amount > 0),
    state   text    NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'captured')),
    version integer NOT NULL DEFAULT 1
)`

// cols are the columns of a payment, as scan reads them.
const cols = "id, state, amount, version"

// service is the payment service, on one database for the payments and idem.
type service struct {
	pool     *pgxpool.Pool
	store    *pgstore.Store
	payments string      // the payments table, quoted for SQL
	log      *log.Logger // idem's decisions and the database's errors
}

// open makes the service, with idem's entries in table and the payments in
// payments, and creates both tables unless they exist.
func open(ctx context.Context, pool *pgxpool.Pool, table, payments string, logger *log.Logger) (*service, error) {
	store, err := pgstore.New(pool, pgstore.WithTable(table))
	if err != nil {
		return nil, err
	}
	s := &service{pool: pool, store: store, payments: pgx.Identifier{payments}.Sanitize(), log: logger}
	// One simple-protocol query is one transaction, which holds the lock:
	// instances starting together do not trip over each other's CREATE.
	lock := "SELECT pg_advisory_xact_lock(hashtext('github.com/idemkit/idem/examples/statemachine'));\n"
	if err = store.CreateTable(ctx); err == nil {
		_, err = pool.Exec(ctx, lock+fmt.Sprintf(paymentsSchema, s.payments))
	}
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("creating the tables: %w", err)
	}
	return s, nil
}

// routes serves the API; only the capture is behind idem (creating a
// payment is not protected here, to keep the example to one technique).
func (s *service) routes(m *idem.Middleware) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /payments", s.create)
	mux.Handle("POST /payments/{id}/capture", nethttp.Middleware(m)(http.HandlerFunc(s.capture)))
	mux.HandleFunc("GET /payments/{id}", s.get)
	return mux
}

// errNotPending: the payment exists, and is not pending any more.
var errNotPending = errors.New("payment not pending")

// capture is POST /payments/{id}/capture.
func (s *service) capture(w http.ResponseWriter, r *http.Request) {
	id, _ := strconv.ParseInt(r.PathValue("id"), 10, 64)
	p, err := s.transition(r.Context(), id)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		fail(w, r, http.StatusNotFound, "No such payment.", 0)
	case errors.Is(err, errNotPending):
		// Another request (another key) captured it. A 4xx is stored: a
		// retry of this request gets the same answer.
		fail(w, r, http.StatusConflict, "The payment is "+p.State+" already; this request changed nothing.", 0)
	case errors.Is(err, storage.ErrNotOwner):
		// This execution lost its lease; the one that holds the key
		// decides. Nothing was changed.
		idem.WriteProblem(w, r, &idem.Error{Kind: idem.ErrConflict, Status: http.StatusConflict, Title: "Request in progress",
			Detail: "Another execution of this request holds its idempotency key; this one changed nothing. Retry to get its result.", RetryAfter: time.Second})
	case err != nil:
		s.log.Printf("POST /payments/%d/capture: %v", id, err)
		fail(w, r, http.StatusServiceUnavailable, "The payment could not be captured now. Retry with the same Idempotency-Key.", time.Second)
	default:
		write(w, http.StatusOK, p)
	}
}

// transition captures payment id in one transaction with idem's fence, the
// fence last before COMMIT. It returns the payment as the transaction left
// it, with errNotPending when it was not pending (nothing changed), or
// pgx.ErrNoRows when there is no such payment.
func (s *service) transition(ctx context.Context, id int64) (payment, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return payment{}, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) // unless committed; ctx may be canceled
	// Under READ COMMITTED a concurrent capture waits for this row's lock,
	// then re-checks the WHERE on the committed row, and changes nothing.
	p, err := scan(tx.QueryRow(ctx, "UPDATE "+s.payments+" SET state = 'captured', version = version + 1\n"+
		"WHERE id = $1 AND state = 'pending' RETURNING "+cols, id))
	if errors.Is(err, pgx.ErrNoRows) { // no pending row: not pending, or no payment
		if p, err = scan(tx.QueryRow(ctx, "SELECT "+cols+" FROM "+s.payments+" WHERE id = $1", id)); err != nil {
			return payment{}, err
		}
		return p, errNotPending
	}
	if err != nil {
		return payment{}, err
	}
	if err := s.store.Fence(ctx, tx); err != nil {
		return payment{}, err // wraps storage.ErrNotOwner when the lease was lost
	}
	return p, tx.Commit(ctx)
}

// create is POST /payments.
func (s *service) create(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Amount int `json:"amount"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Amount <= 0 {
		fail(w, r, http.StatusUnprocessableEntity, "A payment is {\"amount\": a positive number of cents}.", 0)
		return
	}
	p, err := scan(s.pool.QueryRow(r.Context(), "INSERT INTO "+s.payments+" (amount) VALUES ($1) RETURNING "+cols, in.Amount))
	if err != nil {
		s.log.Printf("POST /payments: %v", err)
		fail(w, r, http.StatusServiceUnavailable, "The payment could not be saved now.", time.Second)
		return
	}
	w.Header().Set("Location", "/payments/"+strconv.FormatInt(p.ID, 10))
	write(w, http.StatusCreated, p)
}

// get is GET /payments/{id}.
func (s *service) get(w http.ResponseWriter, r *http.Request) {
	id, _ := strconv.ParseInt(r.PathValue("id"), 10, 64)
	p, err := scan(s.pool.QueryRow(r.Context(), "SELECT "+cols+" FROM "+s.payments+" WHERE id = $1", id))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		fail(w, r, http.StatusNotFound, "No such payment.", 0)
	case err != nil:
		s.log.Printf("GET /payments/%d: %v", id, err)
		fail(w, r, http.StatusServiceUnavailable, "The payment could not be read now.", time.Second)
	default:
		write(w, http.StatusOK, p)
	}
}

// payment is a row of the payments table, and the API's view of it.
type payment struct {
	ID      int64  `json:"payment"`
	State   string `json:"state"`
	Amount  int    `json:"amount"`
	Version int    `json:"version"`
}

func scan(row pgx.Row) (payment, error) {
	var p payment
	err := row.Scan(&p.ID, &p.State, &p.Amount, &p.Version)
	return p, err
}

func write(w http.ResponseWriter, status int, p payment) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(p)
}

// errPayment is the Kind of the service's own problems.
var errPayment = errors.New("payment service")

// fail answers with an RFC 9457 problem, written as idem writes its own.
func fail(w http.ResponseWriter, r *http.Request, status int, detail string, retryAfter time.Duration) {
	idem.WriteProblem(w, r, &idem.Error{Kind: errPayment, Status: status, Title: http.StatusText(status), Detail: detail, RetryAfter: retryAfter})
}
