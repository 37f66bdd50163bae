// Command postgres is an order service on PostgreSQL that creates each
// order exactly once per Idempotency-Key, even when the process dies
// between committing the order and storing its response.
//
//	go run ./examples/postgres -pg 'postgres://user:password@localhost:5432/shop'        # serve on localhost:8080
//	go run ./examples/postgres -pg 'postgres://user:password@localhost:5432/shop' -demo  # run a scripted client against it, then exit
//
// -pg defaults to $IDEM_PG_DSN. At start the service creates idem's table
// (-table, default idem_keys) and the orders table (-orders-table, default
// orders) unless they exist; the database user needs CREATE on the schema,
// or a migration makes them beforehand (pgstore.Schema, and ordersSchema
// below).
//
//	POST /orders     {"item":"book","amount":12}, with an Idempotency-Key (required)
//	-> 201 {"order":1,"item":"book","amount":12,"created_at":"2025-06-01T10:00:00.123456Z"}, Location: /orders/1
//	GET /orders/1    -> 200, the same body
//
// With -demo it plays a client: an order, its retry (replayed), the same
// key with another body (422), a double click (one 201, one 409), a burst
// of identical requests at once (the handler runs for one; the others get
// 409 or its replay), and then counts the rows of the orders table per
// key: one each.
//
// # The deduplication table
//
// idem keeps its entries in the service's own database (storage/pgstore),
// and the handler joins them to its transaction: it inserts the order and
// calls store.Fence(ctx, tx) in the same transaction, last before COMMIT.
// Fence checks that this execution still holds the key's lease and marks
// the key's entry committed, so that the order and the proof that the
// key's request committed exist together or not at all:
//
//   - A retry while the first request runs gets 409 (in progress); a retry
//     after it gets the stored response.
//   - An execution that lost its lease (paused for longer than the lease,
//     while a retry took the key) cannot commit: Fence fails, the
//     transaction rolls back, and the execution that holds the key creates
//     the order.
//   - The process dies after COMMIT and before its response is stored: the
//     entry stays committed, and a retry never runs the handler again.
//     Once the lease of the execution that died has run out (before, a
//     retry gets 409, in progress, as it could still store its response),
//     idem.WithRebuild
//     answers it from the orders table, instead of the 409 idem would
//     answer otherwise ("completed, but its response was not stored"):
//     each order row holds its request's idem.Info.StorageKey (a hash of
//     the principal's scope, the method, the route and the key) in a
//     UNIQUE column, and the response is made of the row's columns only,
//     so the rebuilt 201 is the original, byte for byte, with
//     Idempotent-Replayed: true.
//   - The UNIQUE column also holds once idem has forgotten the key (after
//     its TTL, 24 hours by default): a second order for the key cannot
//     commit, and the request gets 409.
//
// What stays the application's job: effects outside this database, such as
// an e-mail or a call to a payment provider, are not in the transaction,
// so neither the fence nor the rebuild covers them. The process may die
// after such a call and before COMMIT (the retry runs the handler again,
// and calls again), or after COMMIT and before the call (the retry is
// answered from the row, and nothing calls). Give each such effect an
// idempotency key of its own (for a payment provider, its own
// Idempotency-Key header, with a value derived from the order, so that a
// second call is a replay at the provider), or write it to an outbox table
// in the same transaction and send it from there until the provider
// confirms. Also the application's: a TTL at least as long as clients
// retry.
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
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/democlient"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/response"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// envDSN names the environment variable that -pg defaults to.
const envDSN = "IDEM_PG_DSN"

// config is what the flags set.
type config struct {
	addr   string // listen address
	dsn    string // PostgreSQL connection string
	table  string // idem's table
	orders string // the orders table
	demo   bool   // run the scripted client, then exit
}

func main() {
	log.SetFlags(0)
	var c config
	flag.StringVar(&c.addr, "addr", "localhost:8080", "listen address")
	flag.StringVar(&c.dsn, "pg", "", "PostgreSQL connection string, such as 'postgres://user:password@localhost:5432/shop' (default $"+envDSN+")")
	flag.StringVar(&c.table, "table", pgstore.DefaultTable, "idem's table, [schema.]name")
	flag.StringVar(&c.orders, "orders-table", "orders", "the orders table, [schema.]name")
	flag.BoolVar(&c.demo, "demo", false, "serve on a free port, run a scripted client against it, and exit")
	flag.Parse()
	if c.dsn == "" {
		c.dsn = os.Getenv(envDSN)
	}
	if err := run(c, os.Stdout, os.Stderr); err != nil {
		log.Fatal(err)
	}
}

// run opens the database, creates the tables unless they exist, and serves
// until SIGINT or SIGTERM; with c.demo, it serves on a free port while the
// scripted client runs, writing its transcript to out. The middleware's
// decisions and the database's errors are logged to logw. It shuts down in
// the order a deploy needs: the server, the middleware, the store and its
// pool.
func run(c config, out, logw io.Writer) error {
	if c.dsn == "" {
		return errors.New("no database: give -pg 'postgres://user:password@host:5432/dbname', or set " + envDSN)
	}
	pool, err := pgxpool.New(context.Background(), c.dsn)
	if err != nil {
		return fmt.Errorf("-pg: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := open(ctx, pool, c.table, c.orders, democlient.NewClicks(), log.New(logw, "", 0))
	if err != nil {
		pool.Close()
		return err
	}
	defer pool.Close() // 3. the store and its pool, last
	defer s.store.Close()
	h, m, err := s.server()
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
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	var failed error
	if c.demo {
		failed = s.demoClient(out, "http://"+ln.Addr().String())
	} else {
		log.Printf("listening on http://%s (tables %s and %s); try:", ln.Addr(), s.store.Table(), c.orders)
		log.Printf("  curl -i -X POST http://%s/orders -H 'Content-Type: application/json' -H 'Idempotency-Key: order-1' -d '{\"item\":\"book\",\"amount\":12}'", ln.Addr())
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

// ordersSchema is the orders table, for fmt with the table's name (an SQL
// identifier, quoted).
const ordersSchema = `CREATE TABLE IF NOT EXISTS %s (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    item            text        NOT NULL,
    amount          integer     NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- idem.Info.StorageKey of the request that created the order: a hash
    -- of the principal's scope, the method, the route and the
    -- Idempotency-Key. One order per key, even once idem has forgotten the
    -- key; WithRebuild finds the order by it. NULL for an order made
    -- without idem's protection.
    idem_key        text        UNIQUE,
    -- The client's Idempotency-Key, for people reading the table; not
    -- unique: two principals may choose the same key.
    idempotency_key text
)`

// ordersLock is the advisory lock held while the orders table is created,
// so that instances starting together do not trip over each other (two
// concurrent CREATE TABLE IF NOT EXISTS can fail).
const ordersLock = "SELECT pg_advisory_xact_lock(hashtext('github.com/idemkit/idem/examples/postgres'));\n"

// The limits of an order.
const (
	maxItem   = 200 // bytes
	maxAmount = 1_000_000
)

// service is the order service: its handlers, on one database that holds
// both the orders and idem's entries.
type service struct {
	pool   *pgxpool.Pool
	store  *pgstore.Store
	clicks *democlient.Clicks // ?slow=1 for the demo's double click (democlient)
	log    *log.Logger        // the middleware's decisions and the database's errors
	sql    struct {
		insert, byKey, byID, count string
	}
	orders string // the orders table's name, as given
}

// tableName is what -orders-table accepts: pgstore's rule for -table,
// with names of up to 63 bytes.
var tableName = regexp.MustCompile(`^(?:([a-z_][a-z0-9_]{0,62})\.)?([a-z_][a-z0-9_]{0,62})$`)

// open makes the service on pool: idem's store on table, the orders in
// orders; it creates both tables unless they exist.
func open(ctx context.Context, pool *pgxpool.Pool, table, orders string, clicks *democlient.Clicks, logger *log.Logger) (*service, error) {
	m := tableName.FindStringSubmatch(orders)
	if m == nil {
		return nil, fmt.Errorf("-orders-table %q: want lower-case letters, digits and _ (at most 63, not starting with a digit), optionally after a schema and a dot", orders)
	}
	id := pgx.Identifier{m[2]}
	if m[1] != "" {
		id = pgx.Identifier{m[1], m[2]}
	}
	store, err := pgstore.New(pool, pgstore.WithTable(table))
	if err != nil {
		return nil, fmt.Errorf("-table: %w", err)
	}
	if store.Table() == orders {
		store.Close()
		return nil, fmt.Errorf("-table and -orders-table are both %q", orders)
	}
	if err := store.CreateTable(ctx); err != nil {
		store.Close()
		return nil, err
	}
	// Without arguments, Exec sends one simple-protocol query: its
	// statements run in one transaction, which holds the lock.
	if _, err := pool.Exec(ctx, ordersLock+fmt.Sprintf(ordersSchema, id.Sanitize())); err != nil {
		store.Close()
		return nil, fmt.Errorf("creating table %s: %w", orders, err)
	}
	s := &service{pool: pool, store: store, clicks: clicks, log: logger, orders: orders}
	t := id.Sanitize()
	const columns = "id, item, amount, created_at"
	// ON CONFLICT DO NOTHING: when the key has an order already, committed
	// or committing (the INSERT then waits for that transaction's end), no
	// row is returned.
	s.sql.insert = "INSERT INTO " + t + " (item, amount, idem_key, idempotency_key) VALUES ($1, $2, $3, $4)\n" +
		"ON CONFLICT (idem_key) DO NOTHING RETURNING " + columns
	s.sql.byKey = "SELECT " + columns + " FROM " + t + " WHERE idem_key = $1"
	s.sql.byID = "SELECT " + columns + " FROM " + t + " WHERE id = $1"
	s.sql.count = "SELECT idempotency_key, count(*) FROM " + t + " WHERE idempotency_key = ANY($1) GROUP BY 1 ORDER BY 1"
	return s, nil
}

// options are the middleware's options for this service.
func (s *service) options() []idem.Option {
	return []idem.Option{
		// Every order has a key, so that a retry can find it: POST /orders
		// without an Idempotency-Key gets 400.
		idem.WithRequireKey(),
		// A retry of a request whose order committed but whose response
		// was not stored gets the order from the table.
		idem.WithRebuild(s.rebuild),
		idem.WithObserver(func(ev idem.Event) { // logs each decision
			s.log.Printf("idem: %s %s -> %s %d (%v)", ev.Method, ev.Route, ev.Outcome, ev.Status, ev.Duration.Round(time.Microsecond))
		}),
		idem.WithErrorWriter(s.clicks.WriteError), // idem.WriteProblem; democlient adds the double click
	}
}

// server builds the middleware on the service's store, and the service's
// routes behind it. The middleware's Shutdown comes after the server's.
func (s *service) server() (http.Handler, *idem.Middleware, error) {
	m, err := idem.New(s.store, s.options()...)
	if err != nil {
		return nil, nil, err
	}
	return s.routes(m), m, nil
}

// routes serves POST /orders behind m, and GET /orders/{id}, which has no
// need of it.
func (s *service) routes(m *idem.Middleware) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /orders", nethttp.Middleware(m)(http.HandlerFunc(s.create)))
	mux.HandleFunc("GET /orders/{id}", s.get)
	return mux
}

// order is an order as its row holds it, and as the API shows it. A
// response is made of the row's columns only, so that one rebuilt from the
// row is the original, byte for byte.
type order struct {
	ID        int64     `json:"order"`
	Item      string    `json:"item"`
	Amount    int       `json:"amount"`
	CreatedAt time.Time `json:"created_at"`
}

// scanOrder reads an order from a row of id, item, amount, created_at.
func scanOrder(row pgx.Row) (order, error) {
	var o order
	err := row.Scan(&o.ID, &o.Item, &o.Amount, &o.CreatedAt)
	// In UTC, whatever the time zone of the process that answers:
	// instances in other zones rebuild the same bytes.
	o.CreatedAt = o.CreatedAt.UTC()
	return o, err
}

// writeOrder answers with o: 201 with its Location when it was created,
// or a rebuilt creation; 200 for a GET.
func writeOrder(w http.ResponseWriter, status int, o order) {
	body, _ := json.Marshal(o) // cannot fail: no map, no float, a valid time
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if status == http.StatusCreated {
		h.Set("Location", "/orders/"+strconv.FormatInt(o.ID, 10))
	}
	w.WriteHeader(status)
	w.Write(append(body, '\n'))
}

// orderIn is the request body of POST /orders.
type orderIn struct {
	Item   string `json:"item"`
	Amount int    `json:"amount"`
}

// errExists: the request's key has an order already, made by another
// execution of the request.
var errExists = errors.New("an order exists for this idempotency key")

// create is POST /orders: it inserts the order and fences idem's entry in
// one transaction.
func (s *service) create(w http.ResponseWriter, r *http.Request) {
	var in orderIn
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		s.fail(w, r, http.StatusBadRequest, "The body is not a JSON order: "+err.Error()+".", 0, err)
		return
	}
	if in.Item == "" || len(in.Item) > maxItem || in.Amount < 1 || in.Amount > maxAmount {
		s.fail(w, r, http.StatusUnprocessableEntity,
			fmt.Sprintf("An order has an item of 1 to %d bytes and an amount from 1 to %d.", maxItem, maxAmount), 0, nil)
		return
	}
	s.clicks.Hold(r) // ?slow=1 waits for its duplicate's 409 (democlient)
	o, err := s.insert(r.Context(), in)
	switch {
	case errors.Is(err, storage.ErrNotOwner):
		// Fence: this execution lost its lease, and another holds the key
		// now. Nothing was committed; the client's retry gets the other
		// execution's answer.
		s.clicks.WriteError(w, r, &idem.Error{Kind: idem.ErrConflict, Status: http.StatusConflict,
			Title:      "Request in progress",
			Detail:     "Another execution of this request holds its idempotency key; this one changed nothing. Retry to get its result.",
			RetryAfter: time.Second, Err: err})
	case errors.Is(err, errExists):
		// Another execution committed an order for the key: one that took
		// the key from this one, or one before idem forgot the key (TTL).
		s.fail(w, r, http.StatusConflict, "An order was already created with this idempotency key.", 0, err)
	case err != nil:
		// A 5xx is not stored: idem releases the key, and a retry runs the
		// handler again, unless the fence committed (a COMMIT whose answer
		// was lost may have committed): then the retry gets the rebuilt
		// order.
		s.log.Printf("POST /orders: %v", err)
		s.fail(w, r, http.StatusServiceUnavailable, "The order could not be saved now. Retry with the same Idempotency-Key.", time.Second, err)
	default:
		writeOrder(w, http.StatusCreated, o)
	}
}

// insert runs the order's transaction: the INSERT, then the fence, last
// before COMMIT, so that the lease is checked as late as possible and the
// entry's row is locked for the shortest time. ctx is the request's: it
// carries the idem.Info that Fence reads, and a client that goes away
// cancels the transaction.
func (s *service) insert(ctx context.Context, in orderIn) (order, error) {
	info, _ := idem.FromContext(ctx)
	var skey, key *string // NULL for a request idem does not protect (none here: WithRequireKey)
	if info.Protected {
		skey, key = &info.StorageKey, &info.Key
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return order{}, err
	}
	// Rolls back unless committed; not on ctx, which may be canceled.
	defer tx.Rollback(context.WithoutCancel(ctx))
	o, err := scanOrder(tx.QueryRow(ctx, s.sql.insert, in.Item, in.Amount, skey, key))
	if errors.Is(err, pgx.ErrNoRows) {
		return order{}, errExists
	}
	if err != nil {
		return order{}, err
	}
	if err := s.store.Fence(ctx, tx); err != nil {
		return order{}, err // wraps storage.ErrNotOwner when the lease was lost
	}
	if err := tx.Commit(ctx); err != nil {
		return order{}, err
	}
	return o, nil
}

// rebuild is idem.WithRebuild's function. It answers a retry of a request
// that committed its order, but whose response was not stored (the
// process died in between), with the response the first execution sent: the
// order found by the request's storage key. It changes nothing. Without
// such an order it returns false, and the retry gets idem's 409
// ErrNotReplayable. When the database fails it answers 503, which a client
// retries, rather than a 409 that it would not.
func (s *service) rebuild(w http.ResponseWriter, r *http.Request) bool {
	info, _ := idem.FromContext(r.Context())
	o, err := scanOrder(s.pool.QueryRow(r.Context(), s.sql.byKey, info.StorageKey))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false
	case err != nil:
		s.log.Printf("POST /orders, rebuilding a response: %v", err)
		w.Header().Del(response.ReplayedHeader) // replays nothing
		s.fail(w, r, http.StatusServiceUnavailable, "The order could not be read now. Retry with the same Idempotency-Key.", time.Second, err)
		return true
	}
	writeOrder(w, http.StatusCreated, o)
	return true
}

// get is GET /orders/{id}.
func (s *service) get(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		s.fail(w, r, http.StatusNotFound, "No such order.", 0, err)
		return
	}
	o, err := scanOrder(s.pool.QueryRow(r.Context(), s.sql.byID, id))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		s.fail(w, r, http.StatusNotFound, "No such order.", 0, err)
	case err != nil:
		s.log.Printf("GET /orders/%d: %v", id, err)
		s.fail(w, r, http.StatusServiceUnavailable, "The order could not be read now.", time.Second, err)
	default:
		writeOrder(w, http.StatusOK, o)
	}
}

// errService is the Kind of the service's own problem responses.
var errService = errors.New("order service")

// fail answers with an RFC 9457 problem through the kit's error writer,
// so that the service's errors look like idem's: type about:blank, the
// status's text as the title.
func (s *service) fail(w http.ResponseWriter, r *http.Request, status int, detail string, retryAfter time.Duration, cause error) {
	s.clicks.WriteError(w, r, &idem.Error{Kind: errService, Status: status, Title: http.StatusText(status),
		Detail: detail, RetryAfter: retryAfter, Err: cause})
}

// duplicates is how many identical requests the demo sends at once.
const duplicates = 8

// demoClient is the -demo script against base: play's calls (an order,
// its retry, the key with another body, a double click), a burst of
// identical requests (burstOf), and then the rows of the orders table for
// each key: one each.
func (s *service) demoClient(out io.Writer, base string) error {
	run := democlient.RunID()
	keys := []string{"order-1-" + run, "order-2-" + run, "order-3-" + run} // play's two, the burst's
	return errors.Join(
		democlient.Play(out, base, run),
		democlient.Burst(out, base, keys[2], `{"item":"lamp","amount":40}`, duplicates),
		s.showRows(out, keys),
	)
}

// showRows writes the number of orders of each key, and returns an error
// unless each has one.
func (s *service) showRows(out io.Writer, keys []string) error {
	fmt.Fprintf(out, "\n# the orders table: one order per key, however many requests carried it\n"+
		"$ psql -c \"SELECT idempotency_key, count(*) FROM %s WHERE idempotency_key IN ('%s') GROUP BY 1 ORDER BY 1\"\n",
		s.orders, strings.Join(keys, "', '"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := s.pool.Query(ctx, s.sql.count, keys)
	if err != nil {
		return fmt.Errorf("counting the orders: %w", err)
	}
	got := make(map[string]int)
	var (
		key string
		n   int
	)
	_, err = pgx.ForEachRow(rows, []any{&key, &n}, func() error {
		fmt.Fprintf(out, "%s | %d\n", key, n)
		got[key] = n
		return nil
	})
	if err != nil {
		return fmt.Errorf("counting the orders: %w", err)
	}
	var errs []error
	for _, k := range keys {
		if got[k] != 1 {
			errs = append(errs, fmt.Errorf("key %s has %d orders, want 1", k, got[k]))
		}
	}
	return errors.Join(errs...)
}
