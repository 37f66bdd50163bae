package conformance

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// The scenarios of this file are the edges that production hits: a client
// that vanishes mid-response or before the handler answers, a write
// deadline, middleware outside idem that sets headers, and what events
// report.
func init() { scenarios = append(scenarios, edgeScenarios...) }

// bigChunks is the number and size of the writes of a large response
// without Content-Length: 400 KiB in 8 KiB writes, each chunk its own
// letter so that a cut or a reordering shows.
const (
	bigChunks = 50
	chunkSize = 8 << 10
)

func chunk(i int) []byte { return bytes.Repeat([]byte{byte('a' + i%26)}, chunkSize) }

// bigBody is every chunk, as the handler writes them.
func bigBody() []byte {
	var b bytes.Buffer
	for i := range bigChunks {
		b.Write(chunk(i))
	}
	return b.Bytes()
}

// writeRest writes chunks 1.. and reports whether any write failed. It
// ignores the errors, as many handlers do.
func writeRest(w http.ResponseWriter) (failed bool) {
	for i := 1; i < bigChunks; i++ {
		if _, err := w.Write(chunk(i)); err != nil {
			failed = true
		}
	}
	return failed
}

var edgeScenarios = []scenario{
	// The client reads the head of a large response and goes away; the
	// handler goes on writing into a dead connection. The record must not
	// be the few KiB the connection took: a retry gets the not-replayable
	// 409, never a truncated 201.
	{"TruncatedByDisconnect", func(t *testing.T, s *suite) {
		var c counter
		var failed atomic.Bool
		e := s.env([]Route{{"POST", "/export", c.wrap(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusCreated)
			w.Write(chunk(0))
			http.NewResponseController(w).Flush()
			<-r.Context().Done() // the client has gone
			failed.Store(writeRest(w))
		})}})
		conn, err := net.Dial("tcp", e.srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(conn, "POST /export HTTP/1.1\r\nHost: test\r\nIdempotency-Key: k\r\nContent-Length: 0\r\n\r\n")
		res, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(res.Body, make([]byte, 100)); err != nil || res.StatusCode != 201 {
			t.Fatalf("head of the response: %d %v", res.StatusCode, err)
		}
		conn.Close()
		if got := e.ev.waitLen(1, 10*time.Second); len(got) != 1 || got[0] != idem.NotReplayable {
			t.Fatalf("events %v, want [not-replayable]", got)
		}
		if !failed.Load() {
			t.Fatal("no write failed after the client went away: the scenario did not happen")
		}
		r := e.post("/export", "k", "")
		problem(t, r, 409, idem.ErrNotReplayable)
		c.want(t, 1)
	}},
	// http.Server.WriteTimeout passes while the handler still writes: no
	// misbehaving client needed. Without a Content-Length nothing tells a
	// complete body from a cut one, so a retry gets the 409; with one that
	// the handler wrote in full, the record holds every byte the handler
	// wrote and a retry gets all of it.
	{"TruncatedByWriteTimeout", func(t *testing.T, s *suite) {
		const writeTimeout = 200 * time.Millisecond
		full := bigBody()
		var c counter
		var failed [2]atomic.Bool
		slow := func(i int, declare bool) http.Handler {
			return c.wrap(func(w http.ResponseWriter, r *http.Request) {
				if declare {
					w.Header().Set("Content-Length", strconv.Itoa(len(full)))
				}
				w.Header().Set("Content-Type", "application/octet-stream")
				w.WriteHeader(http.StatusCreated)
				w.Write(chunk(0))
				http.NewResponseController(w).Flush()
				// A slow handler: the server's write deadline, set when
				// it read the request, passes meanwhile.
				time.Sleep(2 * writeTimeout)
				failed[i].Store(writeRest(w))
			})
		}
		e := s.serverEnv(nil, func(srv *http.Server) { srv.WriteTimeout = writeTimeout }, []Route{
			{"POST", "/export", slow(0, false)},
			{"POST", "/declared", slow(1, true)},
		})
		for i, path := range []string{"/export", "/declared"} {
			r, err := e.send(context.Background(), req{path: path, key: "k"})
			if err == nil && bytes.Equal(r.body, full) {
				t.Fatalf("%s: the client got the whole body although the write deadline passed", path)
			}
			if got := e.ev.waitLen(i+1, 10*time.Second); len(got) != i+1 {
				t.Fatalf("%s: events %v", path, got)
			}
			if !failed[i].Load() {
				t.Fatalf("%s: no write failed after the write deadline: the scenario did not happen", path)
			}
		}
		problem(t, e.post("/export", "k", ""), 409, idem.ErrNotReplayable)
		var r reply
		for attempt := 1; ; attempt++ {
			// The server's write deadline cuts a replay too: on a loaded
			// machine (CI, -race, a store on another process), reading the
			// record and writing its bytes can outlast it (seen once: EOF
			// on PostgreSQL). Only such a cut is tried again.
			began := time.Now()
			var err error
			if r, err = e.send(context.Background(), req{path: "/declared", key: "k"}); err == nil {
				break
			}
			if took := time.Since(began); took < writeTimeout || attempt == 5 {
				t.Fatalf("replay of the declared response, attempt %d: %v after %v (write timeout %v)", attempt, err, took, writeTimeout)
			}
			t.Logf("replay %d cut by the write deadline: %v", attempt, err)
		}
		if r.status != 201 || !bytes.Equal(r.body, full) || r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("replay of the declared response: %d, %d bytes (want %d), replayed %q",
				r.status, len(r.body), len(full), r.header.Get("Idempotent-Replayed"))
		}
		c.want(t, 2)
		if got := e.ev.outcomes(); got[0] != idem.NotReplayable || got[1] != idem.Executed {
			t.Fatalf("events %v, want [not-replayable executed ...]", got)
		}
	}},
	// A handler that returns when its client goes away, having written
	// nothing, did not do its work: the key is released and the retry runs
	// it, instead of an empty 200 replayed for the TTL.
	{"EarlyReturnOnCancel", func(t *testing.T, s *suite) {
		var c counter
		entered := make(chan struct{}, 1)
		e := s.env([]Route{{"POST", "/o", c.wrap(func(w http.ResponseWriter, r *http.Request) {
			if c.n.Load() == 1 {
				entered <- struct{}{}
				<-r.Context().Done()
				return
			}
			w.WriteHeader(http.StatusCreated)
		})}})
		ctx, cancel := context.WithCancel(context.Background())
		sent := make(chan error, 1)
		go func() {
			_, err := e.send(ctx, req{path: "/o", key: "k"})
			sent <- err
		}()
		<-entered
		cancel()
		if err := <-sent; err == nil {
			t.Fatal("the canceled request got an answer")
		}
		if got := e.ev.waitLen(1, 10*time.Second); len(got) != 1 || got[0] != idem.Canceled {
			t.Fatalf("events %v, want [canceled]", got)
		}
		r := e.post("/o", "k", "")
		if r.status != 201 || r.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("retry after the canceled request: %v", r)
		}
		c.want(t, 2)
	}},
	// Middleware outside idem sets a request id and CORS headers for each
	// request. A replay carries the retry's own, not the first request's,
	// and still the handler's.
	{"OuterHeadersNotFrozen", func(t *testing.T, s *suite) {
		var c counter
		var n atomic.Int64
		outer := func(h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("X-Request-Id", fmt.Sprint("req-", n.Add(1)))
				if o := r.Header.Get("Origin"); o != "" {
					w.Header().Set("Access-Control-Allow-Origin", o)
					w.Header().Set("Vary", "Origin")
				}
				h.ServeHTTP(w, r)
			})
		}
		e := s.wrappedEnv(outer, []Route{{"POST", "/orders", c.wrap(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Order", "42")
			w.Header().Add("Vary", "Accept")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, `{"id":42}`)
		})}})
		first := e.do(req{path: "/orders", key: "k", header: http.Header{"Origin": {"https://a.example"}}})
		retry := e.do(req{path: "/orders", key: "k", header: http.Header{"Origin": {"https://b.example"}}})
		if first.status != 201 || first.header.Get("X-Request-Id") != "req-1" {
			t.Fatalf("first: %v", first)
		}
		if retry.header.Get("Idempotent-Replayed") != "true" || string(retry.body) != `{"id":42}` || retry.header.Get("X-Order") != "42" {
			t.Fatalf("retry not replayed with the handler's response: %v", retry)
		}
		if got := retry.header.Get("X-Request-Id"); got != "req-2" {
			t.Errorf("replay X-Request-Id %q, want the retry's own req-2", got)
		}
		if got := retry.header.Values("Access-Control-Allow-Origin"); len(got) != 1 || got[0] != "https://b.example" {
			t.Errorf("replay Access-Control-Allow-Origin %q, want the retry's origin", got)
		}
		if got := retry.header.Values("Vary"); strings.Join(got, ",") != "Origin,Accept" {
			t.Errorf("replay Vary %q, want the handler's Origin,Accept", got)
		}
		c.want(t, 1)
	}},
	// Events name the route the same way on every adapter (without
	// net/http's method) and carry the request's context.
	{"EventRouteAndContext", func(t *testing.T, s *suite) {
		type ctxKey struct{}
		withID := func(h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, "trace-1")))
			})
		}
		e := s.wrappedEnv(withID, []Route{{"POST", "/orders/{id}", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusCreated)
		})}})
		e.post("/orders/7", "k", "")
		e.post("/orders/7", "k", "")
		e.ev.waitLen(2, 10*time.Second)
		all := e.ev.list()
		for _, ev := range all {
			if ev.Route != "/orders/{id}" && ev.Route != "/orders/:id" {
				t.Errorf("%v event route %q, want the pattern without the method", ev.Outcome, ev.Route)
			}
			if ev.Context == nil || ev.Context.Value(ctxKey{}) != "trace-1" {
				t.Errorf("%v event context does not carry the request's values", ev.Outcome)
			}
		}
		if len(all) != 2 {
			t.Fatalf("events %v", e.ev.outcomes())
		}
	}},
}
