// Command nethttp serves an order endpoint protected by idem on net/http.
//
//	go run ./examples/nethttp                  # serve on :8080, memory store
//	go run ./examples/nethttp -redis localhost:6379
//	go run ./examples/nethttp -demo            # run a scripted client against it, then exit
//
// POST /orders creates an order and answers with its number; the counter
// shows how many times the handler really ran.
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
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/memstore"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/redis/go-redis/v9"
)

func main() {
	addr := flag.String("addr", "localhost:8080", "listen address")
	redisAddr := flag.String("redis", "", "Redis address (host:port); default: the in-memory store")
	demo := flag.Bool("demo", false, "serve on a free port, run a scripted client against it, and exit")
	flag.Parse()

	store, closeStore := openStore(*redisAddr)
	defer closeStore()

	h, err := newServer(store)
	if err != nil {
		log.Fatal(err)
	}
	if *demo {
		*addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	defer srv.Shutdown(context.Background())

	if *demo {
		if err := runDemo("http://" + ln.Addr().String()); err != nil {
			log.Fatal(err)
		}
		return
	}
	log.Printf("listening on http://%s (store: %s)", ln.Addr(), storeName(*redisAddr))
	select {}
}

func openStore(addr string) (storage.Store, func()) {
	if addr == "" {
		s := memstore.New()
		return s, func() { s.Close() }
	}
	// Fail fast when Redis is unreachable: a request waits at most about
	// half a second before its 503, instead of go-redis's defaults.
	rdb := redis.NewClient(&redis.Options{
		Addr:                  addr,
		ContextTimeoutEnabled: true,
		DialTimeout:           250 * time.Millisecond,
		ReadTimeout:           250 * time.Millisecond,
		WriteTimeout:          250 * time.Millisecond,
		MaxRetries:            1,
	})
	return redisstore.New(rdb), func() { rdb.Close() }
}

func storeName(addr string) string {
	if addr == "" {
		return "memory"
	}
	return "redis " + addr
}

// newServer builds the application: one protected endpoint.
func newServer(store storage.Store) (http.Handler, error) {
	m, err := idem.New(store, idem.WithObserver(func(e idem.Event) {
		log.Printf("idem: %s -> %s %d (%v)", e.Route, e.Outcome, e.Status, e.Duration.Round(time.Microsecond))
	}))
	if err != nil {
		return nil, err
	}
	var orders atomic.Int64
	create := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Item   string `json:"item"`
			Amount int    `json:"amount"`
		}
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			http.Error(w, "bad JSON", http.StatusBadRequest)
			return
		}
		if r.URL.Query().Get("slow") != "" {
			time.Sleep(500 * time.Millisecond) // lets the demo show a concurrent duplicate
		}
		n := orders.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/orders/%d", n))
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(map[string]any{"order": n, "item": in.Item, "amount": in.Amount, "handler_runs": n})
	})
	mux := http.NewServeMux()
	mux.Handle("POST /orders", nethttp.Middleware(m)(create))
	return mux, nil
}

// runDemo plays a client that retries, double-clicks and reuses a key.
func runDemo(base string) error {
	step := func(title, key, body, query string) (int, error) {
		req, _ := http.NewRequest("POST", base+"/orders"+query, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		fmt.Printf("\n# %s\n$ curl -X POST %s/orders%s -H 'Idempotency-Key: %s' -d '%s'\n", title, base, query, key, body)
		fmt.Printf("HTTP %d", res.StatusCode)
		for _, h := range []string{"Idempotent-Replayed", "Retry-After", "Content-Type"} {
			if v := res.Header.Get(h); v != "" {
				fmt.Printf("  %s: %s", h, v)
			}
		}
		fmt.Printf("\n%s", b)
		return res.StatusCode, nil
	}
	if _, err := step("first call: the handler runs", "order-1", `{"item":"book","amount":12}`, ""); err != nil {
		return err
	}
	if _, err := step("retry with the same key: replayed, the handler does not run", "order-1", `{"item":"book","amount":12}`, ""); err != nil {
		return err
	}
	if _, err := step("same key, different body: refused", "order-1", `{"item":"book","amount":99}`, ""); err != nil {
		return err
	}
	var wg sync.WaitGroup
	wg.Add(1)
	var slowErr error
	go func() {
		defer wg.Done()
		time.Sleep(100 * time.Millisecond) // let the first request take the key
		_, slowErr = step("double click while the first is still running: conflict", "order-2", `{"item":"pen","amount":3}`, "?slow=1")
	}()
	_, err := step("a slow first request", "order-2", `{"item":"pen","amount":3}`, "?slow=1")
	wg.Wait()
	return errors.Join(err, slowErr)
}

func init() { log.SetOutput(os.Stderr); log.SetFlags(0) }
