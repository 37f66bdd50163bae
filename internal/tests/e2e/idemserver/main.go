// Command idemserver is the application that the end-to-end tests of
// package e2e run as real processes: one protected endpoint on net/http
// with its records in Redis, and a count of its executions kept outside
// the middleware.
//
//	idemserver -redis 127.0.0.1:6379 [-client go-redis|rueidis] [-count-redis addr] [-lease 30s] [-delay 2ms]
//	           [-shutdown-timeout 30s] [-memory] [-gate-at after-count|before-count|after-store]
//
// POST /orders (protected by an Idempotency-Key) first records its
// execution in the Redis hash exec:<key> on the count server: one field
// per execution, named by the execution's id "<pid>-<seq>" (process id and
// sequence number in the process; the response's X-Exec header), holding
// the line "pid seq request-id owner unix-nanoseconds". HSET of the same
// field and value changes nothing, so a command sent again (go-redis
// resends one after a read timeout, and the handler retries a failed one)
// cannot count one execution twice, while another execution, in this
// process or another, has another id: the number of fields is the number
// of executions of the key. Then it passes the gate (below), and, if the request has an X-Hold header, the
// handler blocks until the client goes away or the process is killed, else
// waits -delay, then answers 201 with a JSON body that names this
// execution: process id, sequence number, id and the request's
// X-Request-Id. A replay is that body byte for byte.
//
// With -memory the records are kept in the process's memory (memstore)
// instead of Redis, as a single-instance service keeps them: they die with
// the process. The count is still kept on the count server (-count-redis,
// else -redis), outside the process.
//
// A record the middleware could not store (Complete failed: the store was
// unreachable, or the lease was lost) is reported by adding the lease
// owner's token to the set "lost" on the count server, and on stdout, so a
// test can tell which executions may legitimately be followed by another.
//
// On SIGTERM or SIGINT it shuts down in the order Middleware.Shutdown
// documents, all within -shutdown-timeout: http.Server.Shutdown (stop
// accepting, wait for the handlers), then Middleware.Shutdown (wait for
// their records, including the background retries of those the store
// refused), then it closes the Redis clients and exits 0, or 1 when a step
// failed. It prints each step on stdout, on lines that start with
// "shutdown:" ("shutdown: records stored after 1.2s", or the error).
//
// Three flags exist only to test the tests. -record-twice sends each
// execution's HSET a second time once the first has been stored, as a
// go-redis resend would, and adds the execution's id to the set "resent"
// when that second copy found the field already there. -steal-leases
// breaks the store on purpose: Acquire takes a key held in flight by
// another owner (it deletes the other's lease and acquires again), so
// concurrent duplicates run the handler more than once.
// -no-shutdown-wait skips Middleware.Shutdown: the process exits right
// after http.Server.Shutdown, dropping the records still being retried.
//
// The gate lets a test know how many executions are in flight: POST
// /gate/close makes every handler wait, once its execution is counted,
// until POST /gate/open (or its client leaves); GET /gate/held answers the
// number waiting. It is open at start. -gate-at moves it: before-count
// holds the handler before it records its execution (a process killed
// there never executed), after-store holds every answer of POST /orders
// once the middleware has returned, its record stored, before net/http
// sends the response (a process killed there executed and stored, and its
// client got nothing); after-count is the default.
//
// With -pg it runs on PostgreSQL instead: records in pgstore's table, and
// POST /orders an order service whose order row and fence share one
// transaction (see pgFlags in orders.go); -redis and -count-redis are then
// unused; -pg-store sqlstore keeps them in sqlstore's table instead,
// through database/sql and pgx's driver. With -mysql, the same on MySQL
// or MariaDB through database/sql and sqlstore.
//
// The records' store is redisstore on a go-redis client with
// redisstore.ClientOptions, the options recommended for a request path
// (-redis-timeout, -redis-retries and -dialer-retries change them), or,
// with -client rueidis, rueidisstore on a rueidis client with
// rueidisstore.ClientOption, unchanged (those three flags then apply to
// the count server's client only, which is go-redis's either way). When
// it listens the program prints "listening ADDR" on stdout.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/memstore"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/idemkit/idem/storage/rueidisstore"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on")
	store := flag.String("redis", "127.0.0.1:6379", "address of the Redis holding the records")
	count := flag.String("count-redis", "", "address of the Redis holding exec:<key> and lost (default -redis)")
	prefix := flag.String("prefix", redisstore.DefaultPrefix, "prefix of the record keys")
	lease := flag.Duration("lease", idem.DefaultLease, "lease of a request in flight")
	ttl := flag.Duration("ttl", 10*time.Minute, "how long a response is kept")
	delay := flag.Duration("delay", 0, "how long the handler works before answering")
	timeout := flag.Duration("redis-timeout", 250*time.Millisecond, "go-redis dial, read and write timeout")
	retries := flag.Int("redis-retries", 1, "go-redis MaxRetries")
	dialRetries := flag.Int("dialer-retries", 1, "go-redis DialerRetries (its default, 5, retries a refused dial 4 times, 100 ms apart)")
	failOpen := flag.Bool("fail-open", false, "run the handler unprotected when the store fails (idem.WithFailOpen)")
	twice := flag.Bool("record-twice", false, "test of the count: send each execution's record twice, as a go-redis resend would")
	steal := flag.Bool("steal-leases", false, "test of the count: a broken store whose Acquire takes a key held in flight by another owner")
	grace := flag.Duration("shutdown-timeout", 30*time.Second, "bound of the whole shutdown on SIGTERM or SIGINT")
	noWait := flag.Bool("no-shutdown-wait", false, "test of the shutdown test: exit right after http.Server.Shutdown, without waiting for the records (Middleware.Shutdown)")
	memory := flag.Bool("memory", false, "keep the records in this process's memory (memstore) instead of Redis; the count stays on -count-redis (else -redis)")
	storeClient := flag.String("client", "go-redis", "the Redis client of the records' store: go-redis (redisstore) or rueidis (rueidisstore)")
	var pg pgFlags
	pg.register()
	flag.Parse()
	if *count == "" {
		*count = *store
	}
	if *storeClient != "go-redis" && *storeClient != "rueidis" {
		log.Fatalf("-client %q: want go-redis or rueidis", *storeClient)
	}
	log.SetFlags(0)
	log.SetPrefix(fmt.Sprintf("idemserver[%d]: ", os.Getpid()))

	var (
		inner   storage.Store
		counts  *redis.Client // nil with -pg or -mysql
		handler http.Handler
		closers []func() error
		opts    = []idem.Option{idem.WithLease(*lease), idem.WithTTL(*ttl), idem.WithObserver(observe)}
	)
	g := newGate()
	gateAt := pg.gateAt
	if pg.dsn != "" && pg.mysql != "" {
		log.Fatal("-pg and -mysql: want one")
	}
	if pg.dsn != "" || pg.mysql != "" {
		open := pg.open
		if pg.mysql != "" {
			open = pg.openMySQL
		}
		o, err := open(g, *delay)
		if err != nil {
			log.Fatal(err)
		}
		inner, handler, closers = o.db.store(), o, []func() error{o.close}
		if *steal {
			inner = thief{Store: inner, drop: o.db.drop}
		}
		if pg.rebuild {
			opts = append(opts, idem.WithRebuild(o.rebuild))
		}
	} else {
		switch gateAt {
		case "":
			gateAt = "after-count"
		case "after-count", "before-count", "after-store":
		default:
			log.Fatalf("-gate-at %q: want after-count, before-count or after-store", gateAt)
		}
		client := func(addr string) *redis.Client {
			opt := redisstore.ClientOptions(addr)
			opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = *timeout, *timeout, *timeout
			opt.MaxRetries, opt.DialerRetries = *retries, *dialRetries
			return redis.NewClient(opt)
		}
		counts = client(*count)
		closers = []func() error{counts.Close}
		if *memory {
			mem := memstore.New()
			closers = append(closers, mem.Close)
			owners := &ownerTracker{Store: mem}
			inner = owners
			if *steal {
				inner = thief{Store: owners, drop: owners.drop}
			}
		} else {
			recs, drop, closeRecs := records(*storeClient, *store, *prefix, client)
			closers = append(closers, closeRecs)
			inner = recs
			if *steal {
				inner = thief{Store: inner, drop: drop}
			}
		}
		handler = &app{counts: counts, delay: *delay, twice: *twice, gate: g, gateAt: gateAt}
	}
	st := watched{Store: inner, counts: counts, failed: new(sync.Map)}
	if *failOpen {
		opts = append(opts, idem.WithFailOpen())
	}
	m, err := idem.New(st, opts...)
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	protected := nethttp.Middleware(m)(handler)
	if gateAt == "after-store" {
		protected = afterStore(g, protected)
	}
	mux.Handle("POST /orders", protected)
	mux.HandleFunc("POST /gate/close", func(w http.ResponseWriter, r *http.Request) { g.close() })
	mux.HandleFunc("POST /gate/open", func(w http.ResponseWriter, r *http.Request) { g.openUp() })
	mux.HandleFunc("GET /gate/held", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, g.held.Load()) })

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	stop, unnotify := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer unnotify()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	fmt.Printf("listening %s\n", ln.Addr())
	select {
	case err := <-served:
		log.Fatal(err)
	case <-stop.Done():
	}
	unnotify() // a second signal kills the process
	os.Exit(shutdown(srv, m, st, *grace, *noWait, closers...))
}

// records returns the records' store on the Redis at addr, under prefix,
// through the client that -client names (goRedis makes go-redis's), the
// function that deletes a key's entry (for -steal-leases), and the one
// that closes the client.
func records(name, addr, prefix string, goRedis func(addr string) *redis.Client) (storage.Store, func(ctx context.Context, key string) error, func() error) {
	if name == "rueidis" {
		c, err := rueidis.NewClient(rueidisstore.ClientOption(addr))
		if err != nil {
			log.Fatal(err)
		}
		drop := func(ctx context.Context, key string) error {
			return c.Do(ctx, c.B().Del().Key(prefix+key).Build()).Error()
		}
		return rueidisstore.New(c, rueidisstore.WithPrefix(prefix)), drop, func() error { c.Close(); return nil }
	}
	rdb := goRedis(addr)
	drop := func(ctx context.Context, key string) error { return rdb.Del(ctx, prefix+key).Err() }
	return redisstore.New(rdb, redisstore.WithPrefix(prefix)), drop, rdb.Close
}

// shutdown stops the process in the order Middleware.Shutdown documents,
// all within grace: the server stops accepting and waits for its handlers,
// then the middleware waits for their records (unless noWait, the
// shutdown that forgets them, to test the test), then the Redis clients
// are closed (closers). It prints each step on stdout and returns the exit
// code: 0 when every step succeeded and st holds no record it failed to
// store.
func shutdown(srv *http.Server, m *idem.Middleware, st watched, grace time.Duration, noWait bool, closers ...func() error) int {
	begin := time.Now()
	fmt.Printf("shutdown: signal at %s, within %v\n", begin.Format("15:04:05.000"), grace)
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	code := 0
	if err := srv.Shutdown(ctx); err != nil {
		fmt.Printf("shutdown: server: %v\n", err)
		code = 1
	} else {
		fmt.Printf("shutdown: handlers returned after %v\n", time.Since(begin).Round(time.Millisecond))
	}
	if noWait {
		fmt.Printf("shutdown: not waiting for the records (-no-shutdown-wait): %d not stored yet\n", st.unstored())
	} else if err := m.Shutdown(ctx); err != nil {
		fmt.Printf("shutdown: records: %v\n", err)
		code = 1
	} else if n := st.unstored(); n > 0 {
		// The middleware gave up on them (their lease had passed).
		fmt.Printf("shutdown: %d records not stored\n", n)
		code = 1
	} else {
		fmt.Printf("shutdown: records stored after %v\n", time.Since(begin).Round(time.Millisecond))
	}
	for _, c := range closers {
		if err := c(); err != nil {
			fmt.Printf("shutdown: closing a client: %v\n", err)
			code = 1
		}
	}
	fmt.Printf("shutdown: exit %d after %v\n", code, time.Since(begin).Round(time.Millisecond))
	return code
}

// observe prints the store's failures, with their time, for whoever
// reads the output of a failed test.
func observe(e idem.Event) {
	switch e.Outcome {
	case idem.StoreError, idem.FailedOpen, idem.LeaseLost:
		log.Printf("%s %s after %v: %v", time.Now().Format("15:04:05.000"), e.Outcome, e.Duration.Round(time.Millisecond), e.Err)
	}
}

// app is the protected handler.
type app struct {
	counts *redis.Client
	delay  time.Duration
	twice  bool // -record-twice
	gate   *gate
	gateAt string // -gate-at: where the handler passes the gate
	seq    atomic.Int64
}

// afterStore holds every answer of next at the gate once next has
// returned: the middleware has stored its record (or answered a replay or
// a refusal), and net/http has not sent the response yet (a short body
// stays in its buffer until the handler returns). -gate-at after-store.
func afterStore(g *gate, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r)
		g.pass(r.Context())
	})
}

// gate holds the handlers while it is closed.
type gate struct {
	mu   sync.Mutex
	open chan struct{} // closed while the gate is open
	held atomic.Int64  // handlers waiting
}

func newGate() *gate {
	g := &gate{open: make(chan struct{})}
	close(g.open)
	return g
}

func (g *gate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
		g.open = make(chan struct{})
	default: // closed already
	}
}

func (g *gate) openUp() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
	default:
		close(g.open)
	}
}

// pass waits while the gate is closed, or until ctx ends.
func (g *gate) pass(ctx context.Context) {
	g.mu.Lock()
	open := g.open
	g.mu.Unlock()
	select {
	case <-open:
		return
	default:
	}
	g.held.Add(1)
	defer g.held.Add(-1)
	select {
	case <-open:
	case <-ctx.Done():
	}
}

func (a *app) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if a.gateAt == "before-count" {
		a.gate.pass(r.Context())
		if r.Context().Err() != nil {
			return // the client left at the gate: no execution
		}
	}
	info, _ := idem.FromContext(r.Context())
	pid, seq := os.Getpid(), a.seq.Add(1)
	id := strconv.Itoa(pid) + "-" + strconv.FormatInt(seq, 10)
	rid := r.Header.Get("X-Request-Id")
	owner := info.Owner
	if owner == "" {
		owner = "-" // unprotected: WithFailOpen ran the handler
	}
	line := fmt.Sprintf("%d %d %s %s %d", pid, seq, rid, owner, time.Now().UnixNano())
	if err := a.record(r.Context(), info.Key, id, line); err != nil {
		// Not counted, so not executed: 500 is not stored, and a retry
		// runs again. (The tests take a 500 as a failure.)
		http.Error(w, "count: "+err.Error(), http.StatusInternalServerError)
		return
	}
	if a.gateAt == "after-count" {
		a.gate.pass(r.Context())
	}
	if r.Header.Get("X-Hold") != "" {
		<-r.Context().Done() // until the client leaves or the process is killed
	} else if a.delay > 0 {
		time.Sleep(a.delay)
	}
	body, _ := json.Marshal(map[string]any{
		"key": info.Key, "pid": pid, "seq": seq, "exec": id, "rid": rid, "protected": info.Protected,
	})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Exec", id)
	w.WriteHeader(http.StatusCreated)
	w.Write(body)
}

// record stores the execution id of key: the field id of the hash
// exec:<key>, holding line. The same HSET sent again changes nothing, so
// record retries a failed one (its first copy may have been stored, its
// answer lost) for up to 10 seconds, and an execution is counted once
// whatever go-redis or record resent. With -record-twice it sends the
// command once more after it succeeded, and adds id to the set "resent"
// when that copy found the field there.
func (a *app) record(ctx context.Context, key, id, line string) error {
	h := "exec:" + key
	if err := a.hset(ctx, h, id, line, nil); err != nil || !a.twice {
		return err
	}
	return a.hset(ctx, h, id, line, func(added int64) error {
		if added != 0 {
			return nil // not a copy after all: id is not "resent", which the test sees
		}
		return a.counts.SAdd(ctx, "resent", id).Err()
	})
}

// hset sends HSET h field value until Redis answers it, for up to 10
// seconds or until ctx ends; then it calls then, if not nil, with the
// number of fields the command added.
func (a *app) hset(ctx context.Context, h, field, value string, then func(added int64) error) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	pause := 10 * time.Millisecond
	for {
		added, err := a.counts.HSet(ctx, h, field, value).Result()
		if err == nil {
			if then != nil {
				return then(added)
			}
			return nil
		}
		log.Printf("count %s %s: %v", h, field, err)
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		pause = min(2*pause, 200*time.Millisecond)
	}
}

// thief is the store broken on purpose (-steal-leases), to show that the
// tests see a second execution: its Acquire takes a key held in flight by
// another owner, by deleting the other's lease (drop) and acquiring again.
type thief struct {
	storage.Store
	drop func(ctx context.Context, key string) error
}

func (s thief) Acquire(ctx context.Context, key, owner, fingerprint string, lease time.Duration) (storage.Result, error) {
	res, err := s.Store.Acquire(ctx, key, owner, fingerprint, lease)
	if err != nil || res.State != storage.InFlight {
		return res, err
	}
	if err := s.drop(ctx, key); err != nil {
		return storage.Result{}, err
	}
	log.Printf("stole %s", key)
	return s.Store.Acquire(ctx, key, owner, fingerprint, lease)
}

// ownerTracker is the memory store of -memory, remembering the owner of
// each lease it grants, so that -steal-leases can release another
// owner's lease (drop): one process holds every lease of a memory store.
type ownerTracker struct {
	storage.Store
	owners sync.Map // key -> owner of the last lease granted
}

func (s *ownerTracker) Acquire(ctx context.Context, key, owner, fingerprint string, lease time.Duration) (storage.Result, error) {
	res, err := s.Store.Acquire(ctx, key, owner, fingerprint, lease)
	if err == nil && res.State == storage.Acquired {
		s.owners.Store(key, owner)
	}
	return res, err
}

// drop releases the lease held on key: the broken store of -steal-leases.
func (s *ownerTracker) drop(ctx context.Context, key string) error {
	owner, ok := s.owners.Load(key)
	if !ok {
		return fmt.Errorf("steal %s: no owner known", key)
	}
	return s.Store.Release(ctx, key, owner.(string))
}

// watched is the store, reporting every record it could not store (in
// the set "lost" of counts; only on stdout when counts is nil).
type watched struct {
	storage.Store
	counts *redis.Client
	failed *sync.Map // owners whose Complete failed in this process
}

// unstored returns the number of owners whose last Complete failed.
func (s watched) unstored() int {
	n := 0
	s.failed.Range(func(any, any) bool { n++; return true })
	return n
}

// retried reports whether a Complete of owner failed before, forgetting it.
func (s watched) retried(owner string) bool {
	_, ok := s.failed.LoadAndDelete(owner)
	return ok
}

func (s watched) Complete(ctx context.Context, key, owner string, record []byte, ttl time.Duration) error {
	err := s.Store.Complete(ctx, key, owner, record, ttl)
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	switch {
	case err != nil:
		log.Printf("lost owner=%s not-owner=%t: %v", owner, errors.Is(err, storage.ErrNotOwner), err)
		s.failed.Store(owner, true)
		if s.counts == nil {
			break
		}
		if err := s.counts.SAdd(cctx, "lost", owner).Err(); err != nil {
			log.Printf("lost owner=%s not recorded: %v", owner, err)
		}
	case s.retried(owner):
		// The middleware retries a failed Complete for up to a lease:
		// this one got through after all, so the record is not lost.
		log.Printf("stored after a retry owner=%s", owner)
		if s.counts == nil {
			break
		}
		if err := s.counts.SRem(cctx, "lost", owner).Err(); err != nil {
			log.Printf("lost owner=%s not cleared: %v", owner, err)
		}
	}
	return err
}
