// Command statemachine is a payment service on PostgreSQL whose capture is
// a state transition guarded in SQL, behind idem: the optimistic-lock (or
// state-machine) technique, and what idem adds to it.
//
//	go run ./examples/statemachine -pg 'postgres://user:password@localhost:5432/shop'        # serve on localhost:8080
//	go run ./examples/statemachine -pg 'postgres://user:password@localhost:5432/shop' -demo  # run a scripted client, then exit
//
// -pg defaults to $IDEM_PG_DSN.
//
//	POST /payments                 {"amount":1250}       -> 201 {"payment":1,"state":"pending","amount":1250,"version":1}
//	POST /payments/1/capture       with an Idempotency-Key -> 200 {"payment":1,"state":"captured","amount":1250,"version":2}
//	GET  /payments/1               -> 200, the payment as it is
//
// The capture is one statement that moves the payment from pending to
// captured, and only from pending:
//
//	UPDATE payments SET state = 'captured', version = version + 1
//	WHERE id = $1 AND state = 'pending' RETURNING ...
//
// Whatever the number of requests, with whatever keys, a payment is
// captured at most once: a second UPDATE finds no pending row and changes
// nothing. That guard needs no idem. What it cannot do is answer a retry:
// the client whose first attempt timed out sends it again and gets "not
// pending any more", and cannot tell whether its own attempt captured the
// payment or another did. idem, in front (its entries in the same
// database, its fence in the same transaction as the UPDATE), gives that
// retry the first attempt's answer, 200 captured, byte for byte; a request
// with another key (another client, a double submit that made a new key)
// reaches the guard and gets 409 "already captured". Each technique covers
// what the other cannot: the guard holds for every writer, with or without
// a key, and idem makes a retry safe to send.
//
// The version column is the optimistic lock of the same row: an update
// that read version n writes WHERE version = n, and loses (0 rows) when
// another update came first; the capture's state guard is the same idea,
// with the state instead of a counter.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
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

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// config is what the flags set.
type config struct {
	addr, dsn, table, payments string
	demo                       bool
}

func main() {
	log.SetFlags(0)
	var c config
	flag.StringVar(&c.addr, "addr", "localhost:8080", "listen address")
	flag.StringVar(&c.dsn, "pg", os.Getenv("IDEM_PG_DSN"), "PostgreSQL connection string (default $IDEM_PG_DSN)")
	flag.StringVar(&c.table, "table", pgstore.DefaultTable, "idem's table")
	flag.StringVar(&c.payments, "payments-table", "payments", "the payments table")
	flag.BoolVar(&c.demo, "demo", false, "serve on a free port, run a scripted client against it, and exit")
	flag.Parse()
	if err := run(c, os.Stdout, os.Stderr); err != nil {
		log.Fatal(err)
	}
}

// run opens the database, creates the tables unless they exist, and serves
// until SIGINT or SIGTERM, or, with c.demo, while the scripted client
// writes its transcript to out.
func run(c config, out, logw io.Writer) error {
	if c.dsn == "" {
		return errors.New("no database: give -pg 'postgres://user:password@host:5432/dbname', or set IDEM_PG_DSN")
	}
	pool, err := pgxpool.New(context.Background(), c.dsn)
	if err != nil {
		return fmt.Errorf("-pg: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := open(ctx, pool, c.table, c.payments)
	if err != nil {
		pool.Close()
		return err
	}
	defer pool.Close() // 3. the store, last
	defer s.store.Close()
	logger := log.New(logw, "", 0)
	m, err := idem.New(s.store, idem.WithObserver(func(ev idem.Event) { // logs each decision
		logger.Printf("idem: %s %s -> %s %d (%v)", ev.Method, ev.Route, ev.Outcome, ev.Status, ev.Duration.Round(time.Microsecond))
	}))
	if err != nil {
		return err
	}
	addr := c.addr
	if c.demo {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: s.routes(m), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	var failed error
	if c.demo {
		failed = script(out, "http://"+ln.Addr().String())
	} else {
		log.Printf("listening on http://%s (tables %s and %s); try:", ln.Addr(), c.table, c.payments)
		log.Printf("  curl -i -X POST http://%s/payments -H 'Content-Type: application/json' -d '{\"amount\":1250}'", ln.Addr())
		log.Printf("  curl -i -X POST http://%s/payments/1/capture -H 'Idempotency-Key: capture-1'", ln.Addr())
		sig, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		<-sig.Done()
		stop()
	}
	// 1. the server: no new request, the handlers return; 2. idem: every
	// record stored; 3. the store and its pool (deferred).
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return errors.Join(failed, srv.Shutdown(ctx), m.Shutdown(ctx))
}

// service is the payment service.
type service struct {
	pool  *pgxpool.Pool
	store *pgstore.Store
	sql   struct{ create, capture, get string }
}

// paymentsSchema is the payments table, for fmt with its quoted name.
const paymentsSchema = `CREATE TABLE IF NOT EXISTS %s (
    id      bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    amount  integer NOT NULL CHECK (amount > 0),
    state   text    NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'captured')),
    version integer NOT NULL DEFAULT 1
)`

// open makes the service, creating idem's table and the payments table
// unless they exist (under an advisory lock: instances starting together
// would trip over each other's CREATE TABLE).
func open(ctx context.Context, pool *pgxpool.Pool, table, payments string) (*service, error) {
	store, err := pgstore.New(pool, pgstore.WithTable(table))
	if err != nil {
		return nil, fmt.Errorf("-table: %w", err)
	}
	if err := store.CreateTable(ctx); err != nil {
		store.Close()
		return nil, err
	}
	t := pgx.Identifier{payments}.Sanitize()
	lock := "SELECT pg_advisory_xact_lock(hashtext('github.com/idemkit/idem/examples/statemachine'));\n"
	if _, err := pool.Exec(ctx, lock+fmt.Sprintf(paymentsSchema, t)); err != nil {
		store.Close()
		return nil, fmt.Errorf("creating table %s: %w", payments, err)
	}
	s := &service{pool: pool, store: store}
	const cols = " RETURNING id, state, amount, version"
	s.sql.create = "INSERT INTO " + t + " (amount) VALUES ($1)" + cols
	// The transition: from pending only. Under READ COMMITTED a concurrent
	// capture waits for this row's lock, then re-checks the WHERE on the
	// committed row, finds it captured, and changes nothing.
	s.sql.capture = "UPDATE " + t + " SET state = 'captured', version = version + 1 WHERE id = $1 AND state = 'pending'" + cols
	s.sql.get = "SELECT id, state, amount, version FROM " + t + " WHERE id = $1"
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

// fail answers with an RFC 9457 problem through the kit's error writer.
func (s *service) fail(w http.ResponseWriter, r *http.Request, status int, detail string, retry time.Duration) {
	idem.WriteProblem(w, r, &idem.Error{Kind: errPayment, Status: status, Title: http.StatusText(status), Detail: detail, RetryAfter: retry})
}

// errPayment is the Kind of the service's own problems.
var errPayment = errors.New("payment service")

func (s *service) create(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Amount int `json:"amount"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Amount <= 0 {
		s.fail(w, r, http.StatusUnprocessableEntity, "A payment is {\"amount\": a positive number of cents}.", 0)
		return
	}
	p, err := scan(s.pool.QueryRow(r.Context(), s.sql.create, in.Amount))
	if err != nil {
		s.fail(w, r, http.StatusServiceUnavailable, "The payment could not be saved now.", time.Second)
		return
	}
	w.Header().Set("Location", "/payments/"+strconv.FormatInt(p.ID, 10))
	write(w, http.StatusCreated, p)
}

func (s *service) get(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		s.fail(w, r, http.StatusNotFound, "No such payment.", 0)
		return
	}
	p, err := scan(s.pool.QueryRow(r.Context(), s.sql.get, id))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		s.fail(w, r, http.StatusNotFound, "No such payment.", 0)
	case err != nil:
		s.fail(w, r, http.StatusServiceUnavailable, "The payment could not be read now.", time.Second)
	default:
		write(w, http.StatusOK, p)
	}
}

// errNotPending: the payment exists, and is not pending any more.
var errNotPending = errors.New("payment not pending")

// capture is POST /payments/{id}/capture: the guarded transition and
// idem's fence in one transaction.
func (s *service) capture(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		s.fail(w, r, http.StatusNotFound, "No such payment.", 0)
		return
	}
	p, err := s.transition(r.Context(), id)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		s.fail(w, r, http.StatusNotFound, "No such payment.", 0)
	case errors.Is(err, errNotPending):
		// Another request (another key) captured it: this one changed
		// nothing. A 4xx is stored: a retry of this request gets the same.
		s.fail(w, r, http.StatusConflict, "The payment is "+p.State+" already; this request changed nothing.", 0)
	case errors.Is(err, storage.ErrNotOwner):
		// The fence: this execution lost its lease; the one that holds the
		// key decides. Nothing was changed.
		s.fail(w, r, http.StatusConflict, "Another execution of this request holds its key. Retry to get its result.", time.Second)
	case err != nil:
		s.fail(w, r, http.StatusServiceUnavailable, "The payment could not be captured now. Retry with the same Idempotency-Key.", time.Second)
	default:
		write(w, http.StatusOK, p)
	}
}

// transition captures payment id in one transaction with idem's fence. It
// returns the payment as the transaction left it, with errNotPending when
// it was not pending (nothing changed), or pgx.ErrNoRows when it does not
// exist.
func (s *service) transition(ctx context.Context, id int64) (payment, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return payment{}, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	p, err := scan(tx.QueryRow(ctx, s.sql.capture, id))
	if errors.Is(err, pgx.ErrNoRows) {
		// No pending row: tell "not pending" from "no such payment".
		if p, err = scan(tx.QueryRow(ctx, s.sql.get, id)); err != nil {
			return payment{}, err
		}
		return p, errNotPending
	}
	if err != nil {
		return payment{}, err
	}
	if err := s.store.Fence(ctx, tx); err != nil {
		return payment{}, err
	}
	return p, tx.Commit(ctx)
}

// script is the demo's client: it creates a payment, captures it, retries
// the capture with the same key, then captures it with another key.
func script(out io.Writer, base string) error {
	var rnd [4]byte
	rand.Read(rnd[:])
	run := hex.EncodeToString(rnd[:]) // this run's keys differ from every other run's
	res, err := http.Post(base+"/payments", "application/json", strings.NewReader(`{"amount":1250}`))
	if err != nil {
		return err
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	var p payment
	if err := json.Unmarshal(body, &p); err != nil || res.StatusCode != http.StatusCreated {
		return fmt.Errorf("creating a payment: %d %s", res.StatusCode, body)
	}
	fmt.Fprintf(out, "created: HTTP %d %s", res.StatusCode, body)
	capture := base + "/payments/" + strconv.FormatInt(p.ID, 10) + "/capture"
	for _, step := range []struct{ title, key string }{
		{"capture (key A): the transition runs", "capture-" + run + "-a"},
		{"the client retries (key A): idem replays the first answer", "capture-" + run + "-a"},
		{"another request (key B): the state guard refuses, nothing changes", "capture-" + run + "-b"},
		{"that request retried (key B): its own answer, replayed", "capture-" + run + "-b"},
	} {
		req, err := http.NewRequest(http.MethodPost, capture, nil)
		if err != nil {
			return err
		}
		req.Header.Set("Idempotency-Key", step.key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		replayed := ""
		if res.Header.Get("Idempotent-Replayed") == "true" {
			replayed = "  Idempotent-Replayed: true"
		}
		fmt.Fprintf(out, "\n# %s\nHTTP %d%s\n%s", step.title, res.StatusCode, replayed, body)
	}
	res, err = http.Get(base + "/payments/" + strconv.FormatInt(p.ID, 10))
	if err != nil {
		return err
	}
	body, _ = io.ReadAll(res.Body)
	res.Body.Close()
	fmt.Fprintf(out, "\n# the payment now: captured once\nHTTP %d\n%s", res.StatusCode, body)
	return nil
}
