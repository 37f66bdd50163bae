// Command loadtest measures what the idem middleware costs under load, on
// loopback, against two references: the same handler without the
// middleware (bare), and the floor, a client that calls the store's own
// operations directly, without HTTP, as the middleware does for each
// request (Acquire then Complete for a first execution, one Acquire for a
// replay).
//
//	go run ./internal/tests/loadtest                            # memory store, 3 s per phase
//	go run ./internal/tests/loadtest -store redis               # starts a redis-server from PATH
//	go run ./internal/tests/loadtest -store redis -redis localhost:6379 -duration 5s -concurrency 32
//
// It serves a protected POST handler (201, three headers, a 200-byte JSON
// body) and the same handler bare on a loopback port, runs each phase for
// -duration with -concurrency clients, and prints requests per second, p50
// and p99 per phase, then each protected figure as a ratio of its floor
// and of bare. Phases: bare, first (a new key per request), replay (the
// same key again), floor-first and floor-replay; with -store redis also the
// naive floors (redisfloors.go): handlers on the same server that make a
// first execution's two plain round trips (SET NX PX, then SET PX of 512
// bytes) or a replay's one (GET) with go-redis or with rueidis, and answer
// as the protected handler does: what a store of plain commands would
// cost, through net/http like the protected phases, without idem.
//
// With -store redis and no -redis address it starts its own redis-server
// (no persistence, a free loopback port) and kills it, and waits for it, on
// exit. Against a server given with -redis it deletes the keys it wrote.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/httprec"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/response"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/memstore"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/redis/go-redis/v9"
)

// The response of the handler: a 200-byte JSON body and three headers.
var (
	orderJSON   = []byte(`{"id":42,"status":"created","customer":"c_8d2f","items":[{"sku":"A-1","qty":2},{"sku":"B-7","qty":1}],"total":{"amount":"129.90","currency":"EUR"},"created_at":"2026-11-22T20:20:00Z","note":"at door"}`)
	requestJSON = []byte(`{"customer":"c_8d2f","items":[{"sku":"A-1","qty":2},{"sku":"B-7","qty":1}]}`)
)

func main() {
	duration := flag.Duration("duration", 3*time.Second, "how long each phase runs")
	concurrency := flag.Int("concurrency", 32, "concurrent clients")
	storeName := flag.String("store", "memory", "store: memory or redis")
	redisAddr := flag.String("redis", "", "address of a running Redis (default: start a redis-server from PATH)")
	flag.Parse()
	if *concurrency < 1 || *duration <= 0 {
		log.Fatal("loadtest: -concurrency and -duration must be positive")
	}
	if err := run(*duration, *concurrency, *storeName, *redisAddr); err != nil {
		log.Fatal("loadtest: ", err)
	}
}

func run(duration time.Duration, concurrency int, storeName, redisAddr string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	store, addr, closeStore, err := openStore(storeName, redisAddr, concurrency)
	if err != nil {
		return err
	}
	defer closeStore()
	m, err := idem.New(store)
	if err != nil {
		return err
	}

	mux := http.NewServeMux()
	mux.Handle("POST /bare", http.HandlerFunc(handler))
	mux.Handle("POST /orders", nethttp.Middleware(m)(http.HandlerFunc(handler)))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(l)
	defer srv.Close()
	base := "http://" + l.Addr().String()
	client := &http.Client{Transport: &http.Transport{
		MaxIdleConns:        concurrency,
		MaxIdleConnsPerHost: concurrency,
	}}

	fmt.Printf("store %s, %d clients, %v per phase, GOMAXPROCS %d\n\n", storeName, concurrency, duration, runtime.GOMAXPROCS(0))
	var keys atomic.Int64
	post := func(path, key string) error {
		req, _ := http.NewRequest(http.MethodPost, base+path, bytes.NewReader(requestJSON))
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			return fmt.Errorf("%s: status %d", path, resp.StatusCode)
		}
		if replayed := resp.Header.Get(response.ReplayedHeader) == "true"; replayed != (key != "" && keys.Load() < 0) {
			// keys < 0 marks the replay phase, where every answer must
			// be a replay, and the first phase, where none may be.
			return fmt.Errorf("%s: replayed=%v", path, replayed)
		}
		return nil
	}

	// postPlain posts to a naive floor's route (redisfloors.go).
	postPlain := func(path, key string) error {
		req, _ := http.NewRequest(http.MethodPost, base+path, bytes.NewReader(requestJSON))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			return fmt.Errorf("%s: status %d: %s", path, resp.StatusCode, body)
		}
		return nil
	}

	// The floor: the store's operations without HTTP, with the same
	// arguments the middleware passes.
	rec := httprec.Record{Status: http.StatusCreated, Header: http.Header{
		"Content-Type": {"application/json"}, "Location": {"/orders/42"}, "X-Request-Id": {"2f1c7a9e-6f7d-4a8e-9f55-0d3c1b2a4e6f"},
	}, Body: orderJSON}
	encoded, err := rec.MarshalBinary()
	if err != nil {
		return err
	}
	const lease, ttl = idem.DefaultLease, idem.DefaultTTL
	fp := "0123456789abcdef"
	floorKey := func(n int64) string { return "floor-" + strconv.FormatInt(n, 10) }
	owner := "0123456789abcdef0123456789abcdef"

	phases := []phase{
		{"bare", func(int) error { return post("/bare", "") }},
		{"first", func(int) error { return post("/orders", "first-"+strconv.FormatInt(keys.Add(1), 10)) }},
		{"replay", func(w int) error { return post("/orders", "replay-"+strconv.Itoa(w)) }},
		{"floor-first", func(int) error {
			k := floorKey(keys.Add(1))
			if res, err := store.Acquire(ctx, k, owner, fp, lease); err != nil || res.State != storage.Acquired {
				return fmt.Errorf("acquire: %v %v", res.State, err)
			}
			return store.Complete(ctx, k, owner, encoded, ttl)
		}},
		{"floor-replay", func(w int) error {
			res, err := store.Acquire(ctx, floorKey(-1-int64(w)), owner+"x", fp, lease)
			if err == nil && res.State != storage.Done {
				err = fmt.Errorf("acquire: %v", res.State)
			}
			return err
		}},
	}
	if addr != "" {
		closeFloors, err := redisFloors(mux, addr, concurrency, lease, ttl)
		if err != nil {
			return err
		}
		defer closeFloors()
		for _, client := range []string{"go-redis", "rueidis"} {
			phases = append(phases,
				phase{client + "-first", func(int) error {
					return postPlain("/"+client+"/first", client+"-first-"+strconv.FormatInt(keys.Add(1), 10))
				}},
				phase{client + "-replay", func(w int) error { return postPlain("/"+client+"/replay", client+"-replay-"+strconv.Itoa(w)) }})
		}
	}
	results := map[string]result{}
	for _, p := range phases {
		switch p.name {
		case "replay": // one stored key per client, then replays only
			keys.Store(0)
			for w := range concurrency {
				if err := post("/orders", "replay-"+strconv.Itoa(w)); err != nil {
					return err
				}
			}
			keys.Store(-1)
		case "floor-replay":
			for w := range concurrency {
				k := floorKey(-1 - int64(w))
				if _, err := store.Acquire(ctx, k, owner, fp, lease); err != nil {
					return err
				}
				if err := store.Complete(ctx, k, owner, encoded, ttl); err != nil {
					return err
				}
			}
		default:
			keys.Store(0)
		}
		r, err := p.run(ctx, duration, concurrency)
		if err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
		results[p.name] = r
		fmt.Printf("%-13s %9.0f req/s   p50 %9v   p99 %9v   (%d requests)\n", p.name, r.rate, r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond), r.n)
	}

	b := results["bare"]
	fmt.Println()
	comparisons := []struct{ name, floor string }{{"first", "floor-first"}, {"replay", "floor-replay"}}
	if addr != "" {
		comparisons = append(comparisons, []struct{ name, floor string }{
			{"first", "go-redis-first"}, {"replay", "go-redis-replay"}, {"first", "rueidis-first"}, {"replay", "rueidis-replay"},
		}...)
	}
	for _, c := range comparisons {
		r, f := results[c.name], results[c.floor]
		fmt.Printf("%-7s %5.1f %% of its floor's req/s (%s), %5.1f %% of bare; p50 %.2fx the floor's, %.2fx bare's; p99 %.2fx the floor's, %.2fx bare's\n",
			c.name, 100*r.rate/f.rate, c.floor, 100*r.rate/b.rate,
			ratio(r.p50, f.p50), ratio(r.p50, b.p50), ratio(r.p99, f.p99), ratio(r.p99, b.p99))
	}
	return nil
}

func ratio(a, b time.Duration) float64 { return float64(a) / float64(b) }

func handler(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Location", "/orders/42")
	h.Set("X-Request-Id", "2f1c7a9e-6f7d-4a8e-9f55-0d3c1b2a4e6f")
	w.WriteHeader(http.StatusCreated)
	w.Write(orderJSON)
}

// phase is one kind of request, sent by each client in a loop.
type phase struct {
	name string
	do   func(worker int) error
}

type result struct {
	n        int
	rate     float64
	p50, p99 time.Duration
}

// run sends requests from concurrency clients for d and returns the rate
// and latency percentiles. The first error stops the phase.
func (p phase) run(ctx context.Context, d time.Duration, concurrency int) (result, error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	lat := make([][]time.Duration, concurrency)
	errs := make([]error, concurrency)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := make([]time.Duration, 0, 1<<14)
			for ctx.Err() == nil {
				t := time.Now()
				if err := p.do(w); err != nil {
					errs[w] = err
					cancel()
					break
				}
				l = append(l, time.Since(t))
			}
			lat[w] = l
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return result{}, err
	}
	all := slices.Concat(lat...)
	if len(all) == 0 {
		return result{}, errors.New("no request completed")
	}
	slices.Sort(all)
	return result{
		n:    len(all),
		rate: float64(len(all)) / elapsed.Seconds(),
		p50:  all[len(all)*50/100],
		p99:  all[len(all)*99/100],
	}, nil
}

// openStore opens the store and returns the Redis address it uses (""
// for memory) and the function that closes it and whatever it started.
func openStore(name, addr string, concurrency int) (storage.Store, string, func(), error) {
	switch name {
	case "memory":
		s := memstore.New(memstore.WithMaxEntries(1 << 20))
		return s, "", func() { s.Close() }, nil
	case "redis":
	default:
		return nil, "", nil, fmt.Errorf("unknown store %q (memory or redis)", name)
	}
	stopServer := func() {}
	if addr == "" {
		var err error
		if addr, stopServer, err = startRedis(); err != nil {
			return nil, "", nil, err
		}
	}
	// The options the README recommends for a web
	// service, and a pool as large as the load.
	opt := redisstore.ClientOptions(addr) // what the README recommends
	opt.PoolSize = concurrency + 4
	rdb := redis.NewClient(opt)
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		rdb.Close()
		stopServer()
		return nil, "", nil, fmt.Errorf("redis at %s: %w", addr, err)
	}
	prefix := fmt.Sprintf("idem-loadtest:%d:", time.Now().UnixNano())
	return redisstore.New(rdb, redisstore.WithPrefix(prefix)), addr, func() {
		deleteKeys(rdb, prefix)
		rdb.Close()
		stopServer()
	}, nil
}

// deleteKeys deletes the keys under prefix.
func deleteKeys(rdb *redis.Client, prefix string) {
	ctx := context.Background()
	iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		if keys = append(keys, iter.Val()); len(keys) == 1000 {
			rdb.Unlink(ctx, keys...)
			keys = keys[:0]
		}
	}
	if len(keys) > 0 {
		rdb.Unlink(ctx, keys...)
	}
}

// startRedis starts a redis-server from PATH on a free loopback port,
// without persistence, and returns its address and the function that kills
// it and waits for it.
func startRedis() (string, func(), error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", nil, errors.New("no redis-server on PATH: install one or pass -redis host:port")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop := func() {
		cmd.Process.Kill()
		cmd.Wait()
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	for deadline := time.Now().Add(5 * time.Second); ; {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
			return addr, stop, nil
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, fmt.Errorf("redis-server on %s did not start: %w", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
