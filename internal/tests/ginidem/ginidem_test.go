package ginidem_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/idemkit/idem"
	"github.com/idemkit/idem/ginidem"
	"github.com/idemkit/idem/internal/dynamotest"
	"github.com/idemkit/idem/internal/leakcheck"
	"github.com/idemkit/idem/internal/mysqltest"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/redistest"
	"github.com/idemkit/idem/internal/tests/conformance"
)

func TestMain(m *testing.M) {
	gin.SetMode(gin.TestMode)
	gin.DefaultErrorWriter = io.Discard // gin.Recovery's panic reports
	// Stops the servers the conformance suite started.
	leakcheck.Main(dynamotest.Wrap(mysqltest.Wrap(pgtest.Wrap(redistest.Wrap(m)))))
}

func TestConformance(t *testing.T) {
	t.Run("global", func(t *testing.T) {
		conformance.Run(t, conformance.Adapter{Name: "gin", Mount: func(m *idem.Middleware, routes ...conformance.Route) http.Handler {
			r := gin.New()
			r.Use(gin.Recovery(), ginidem.Middleware(m))
			for _, rt := range routes {
				r.Handle(rt.Method, conformance.ColonPattern(rt.Pattern, "*$1"), gin.WrapH(rt.Handler))
			}
			return r
		}})
	})
	t.Run("per-route", func(t *testing.T) {
		conformance.Run(t, conformance.Adapter{Name: "gin-route", Mount: func(m *idem.Middleware, routes ...conformance.Route) http.Handler {
			r := gin.New()
			r.Use(gin.Recovery())
			for _, rt := range routes {
				r.Handle(rt.Method, conformance.ColonPattern(rt.Pattern, "*$1"), ginidem.Middleware(m), gin.WrapH(rt.Handler))
			}
			return r
		}})
	})
}

// opener starts a real server: gin.New, gin.Recovery, then whatever setup
// adds, with a Middleware on a fresh store.
type opener = conformance.Open[*gin.Engine]

// eachStore runs f on every trap-test store kind, in parallel subtests.
func eachStore(t *testing.T, f func(t *testing.T, open opener)) {
	conformance.EachStore(t, func() *gin.Engine {
		r := gin.New()
		r.Use(gin.Recovery())
		return r
	}, f)
}

// handlerCase is one Gin handler whose response the first client and the
// replay must both get.
type handlerCase struct {
	name        string
	handler     gin.HandlerFunc
	status      int
	body        string
	contentType string
}

func runCases(t *testing.T, cases []handlerCase) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			eachStore(t, func(t *testing.T, open opener) {
				var runs conformance.Runs
				e := open(func(r *gin.Engine, m *idem.Middleware) {
					r.POST("/o", ginidem.Middleware(m), func(c *gin.Context) { runs.Add(1); tc.handler(c) })
				})
				orig := e.Post("/o", "k", "")
				if orig.Status != tc.status || orig.Body != tc.body || orig.Header.Get("Content-Type") != tc.contentType {
					t.Fatalf("original: %d %q %q, want %d %q %q", orig.Status, orig.Header.Get("Content-Type"), orig.Body,
						tc.status, tc.contentType, tc.body)
				}
				conformance.SameReply(t, orig, e.Post("/o", "k", ""))
				runs.Want(t, 1)
			})
		})
	}
}

// Gin's WriteHeader only records the status and the last one wins, the
// opposite of net/http: what the client gets is what must be stored.
func TestLastStatusWins(t *testing.T) {
	runCases(t, []handlerCase{
		{"status then status then write", func(c *gin.Context) {
			c.Status(http.StatusBadRequest)
			c.Status(http.StatusAccepted)
			c.Writer.WriteString("queued")
		}, 202, "queued", "text/plain; charset=utf-8"},
		{"status then render", func(c *gin.Context) {
			c.Status(http.StatusInternalServerError)
			c.String(http.StatusCreated, "made")
		}, 201, "made", "text/plain; charset=utf-8"},
		{"status after the body is ignored", func(c *gin.Context) {
			c.String(http.StatusCreated, "made")
			c.Status(http.StatusInternalServerError)
		}, 201, "made", "text/plain; charset=utf-8"},
	})
}

// A status without a body is only recorded by Gin (Written is false, Size
// -1); Gin sends it after the chain. An empty handler is a 200.
func TestBodylessStatus(t *testing.T) {
	runCases(t, []handlerCase{
		{"c.Status(201)", func(c *gin.Context) {
			c.Header("Location", "/o/1")
			c.Status(http.StatusCreated)
			if c.Writer.Written() || c.Writer.Size() != -1 || c.Writer.Status() != 201 {
				panic("gin semantics changed")
			}
		}, 201, "", ""},
		{"empty handler", func(c *gin.Context) {}, 200, "", ""},
	})
}

// c.JSON(204, ...), c.AbortWithStatus and c.Data with a bodyless status go
// through WriteHeaderNow, which the writer must intercept.
func TestWriteHeaderNow(t *testing.T) {
	runCases(t, []handlerCase{
		{"c.JSON(204)", func(c *gin.Context) { c.JSON(http.StatusNoContent, gin.H{"ignored": true}) }, 204, "", "application/json; charset=utf-8"},
		{"c.AbortWithStatus(401)", func(c *gin.Context) { c.AbortWithStatus(http.StatusUnauthorized) }, 401, "", ""},
		{"status, Flush, then body", func(c *gin.Context) {
			c.Status(http.StatusAccepted)
			c.Writer.Flush() // commits the recorded status, as WriteHeaderNow does
			c.Writer.WriteString("queued")
		}, 202, "queued", ""},
		{"WriteHeaderNow then later status", func(c *gin.Context) {
			c.Status(http.StatusAccepted)
			c.Writer.WriteHeaderNow()
			c.Status(http.StatusTeapot) // ignored: the status is out
		}, 202, "", ""},
	})
}

// A declined payment rendered with c.JSON is a cacheable 402.
func TestJSON402Replayed(t *testing.T) {
	runCases(t, []handlerCase{
		{"c.JSON(402)", func(c *gin.Context) {
			c.JSON(http.StatusPaymentRequired, gin.H{"error": "declined", "code": 17})
		}, 402, `{"code":17,"error":"declined"}`, "application/json; charset=utf-8"},
	})
}

// After a replay or a refusal the middleware must c.Abort, or Gin runs the
// rest of the chain and the handler writes a second body.
func TestNoHandlerAfterReplayOrRefusal(t *testing.T) {
	eachStore(t, func(t *testing.T, open opener) {
		var runs conformance.Runs
		var slow, after atomic.Int64
		gate := make(chan struct{})
		entered := make(chan struct{}, 1)
		e := open(func(r *gin.Engine, m *idem.Middleware) {
			r.Use(ginidem.Middleware(m))
			r.POST("/o", func(c *gin.Context) {
				runs.Add(1)
				if c.Query("slow") != "" && slow.Add(1) == 1 { // only the first one waits
					entered <- struct{}{}
					<-gate
				}
				c.String(http.StatusCreated, "order %d", runs.Load())
			}, func(c *gin.Context) { after.Add(1) })
		})
		orig := e.Post("/o", "k", "a")
		if orig.Status != 201 || orig.Body != "order 1" {
			t.Fatalf("original: %v", orig)
		}
		for range 2 {
			conformance.SameReply(t, orig, e.Post("/o", "k", "a"))
		}
		if r := e.Post("/o", "k", "different"); r.Status != 422 || strings.Contains(r.Body, "order") {
			t.Fatalf("mismatch: %v", r)
		}
		done := make(chan conformance.Reply)
		go func() { done <- e.Post("/o?slow=1", "k2", "") }()
		<-entered
		if r := e.Post("/o?slow=1", "k2", ""); r.Status != 409 || strings.Contains(r.Body, "order") {
			t.Fatalf("conflict: %v", r)
		}
		close(gate)
		if r := <-done; r.Status != 201 {
			t.Fatalf("slow first: %v", r)
		}
		runs.Want(t, 2)
		if after.Load() != 2 {
			t.Fatalf("the handler after ran %d times, want 2 (only for executions)", after.Load())
		}
	})
}

// Gin runs global middleware for unmatched routes with FullPath() == "" and
// writes its 404 (or 405) after them: nothing may be stored.
func TestUnmatchedRouteNotStored(t *testing.T) {
	eachStore(t, func(t *testing.T, open opener) {
		e := open(func(r *gin.Engine, m *idem.Middleware) {
			r.HandleMethodNotAllowed = true
			r.Use(ginidem.Middleware(m))
			r.GET("/only-get", func(c *gin.Context) {})
		})
		for range 2 {
			if r := e.Post("/nope", "k", ""); r.Status != 404 || r.Body != "404 page not found" || r.Header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("unmatched route: %v", r)
			}
			if r := e.Post("/only-get", "k", ""); r.Status != 405 || r.Header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("method not allowed: %v", r)
			}
		}
		if got := e.Outcomes(); len(got) != 0 {
			t.Fatalf("unmatched routes reached the middleware's protocol: %v", got)
		}
	})
}

// http.NewResponseController(c.Writer).Flush must reach the client at once
// (it needs the writer's Flush/FlushError and Unwrap), and the streamed
// response must still be replayed.
func TestResponseControllerFlush(t *testing.T) {
	eachStore(t, func(t *testing.T, open opener) {
		proceed := make(chan struct{})
		var runs conformance.Runs
		e := open(func(r *gin.Engine, m *idem.Middleware) {
			r.POST("/o", ginidem.Middleware(m), func(c *gin.Context) {
				runs.Add(1)
				c.Header("Content-Type", "text/plain")
				c.Status(http.StatusAccepted)
				c.Writer.WriteString("first;")
				if err := http.NewResponseController(c.Writer).Flush(); err != nil {
					t.Errorf("ResponseController.Flush: %v", err)
				}
				conformance.WaitOrTimeout(t, proceed, "the client never saw the flushed chunk")
				c.Writer.WriteString("second")
			})
		})
		orig := e.PostStreamed("/o", "k", "first;", proceed)
		e.WantReplayed(orig, 202, "first;second", "/o", "k", &runs)
	})
}

// c.Stream and c.SSEvent flush every event to the client and use
// CloseNotify.
func TestStreamSSE(t *testing.T) {
	eachStore(t, func(t *testing.T, open opener) {
		proceed := make(chan struct{})
		var runs conformance.Runs
		e := open(func(r *gin.Engine, m *idem.Middleware) {
			r.POST("/events", ginidem.Middleware(m), func(c *gin.Context) {
				runs.Add(1)
				i := 0
				c.Stream(func(w io.Writer) bool { // Stream flushes after each step
					i++
					if i == 2 {
						conformance.WaitOrTimeout(t, proceed, "the client never saw the first event")
					}
					c.SSEvent("tick", i)
					return i < 3
				})
			})
		})
		orig := e.PostStreamed("/events", "k", "event:tick\ndata:1\n\n", proceed)
		if ct := orig.Header.Get("Content-Type"); ct != "text/event-stream;charset=utf-8" {
			t.Fatalf("original Content-Type %q", ct)
		}
		e.WantReplayed(orig, 200, "event:tick\ndata:1\n\nevent:tick\ndata:2\n\nevent:tick\ndata:3\n\n", "/events", "k", &runs)
	})
}

// A hijacked connection cannot be replayed: the retry gets 409 and the
// handler does not run again.
func TestHijack(t *testing.T) {
	eachStore(t, func(t *testing.T, open opener) {
		var runs conformance.Runs
		e := open(func(r *gin.Engine, m *idem.Middleware) {
			r.POST("/o", ginidem.Middleware(m), func(c *gin.Context) {
				runs.Add(1)
				conn, rw, err := c.Writer.Hijack()
				if err != nil {
					t.Errorf("Hijack: %v", err)
					return
				}
				defer conn.Close()
				rw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi")
				rw.Flush()
			})
		})
		if r := e.Post("/o", "k", ""); r.Status != 200 || r.Body != "hi" {
			t.Fatalf("hijacked: %v", r)
		}
		// The handler answered before the middleware stored its record.
		if got := e.WaitOutcomes(1); got[0] != idem.NotReplayable {
			t.Fatalf("events %v", got)
		}
		if r := e.Post("/o", "k", ""); r.Status != 409 || !strings.Contains(r.Body, "ErrNotReplayable") {
			t.Fatalf("retry after hijack: %v", r)
		}
		runs.Want(t, 1)
	})
}

// Outer middleware (a logger) sees the final status, replays and refusals
// included, and gets its own c.Writer back, even after a panic.
func TestOuterMiddlewareSeesFinalStatus(t *testing.T) {
	eachStore(t, func(t *testing.T, open opener) {
		var mu sync.Mutex
		var logged []int
		e := open(func(r *gin.Engine, m *idem.Middleware) {
			r.Use(func(c *gin.Context) {
				w := c.Writer
				defer func() {
					if c.Writer != w {
						t.Error("c.Writer was not restored")
					}
					mu.Lock()
					logged = append(logged, c.Writer.Status())
					mu.Unlock()
				}()
				c.Next()
			}, ginidem.Middleware(m))
			r.POST("/o", func(c *gin.Context) {
				if c.Query("panic") != "" {
					panic("boom")
				}
				c.Status(http.StatusCreated) // bodyless: Gin sends it after the chain
			})
		})
		e.Post("/o", "k", "")
		e.Post("/o", "k", "")
		e.Post("/o", "k", "other body")
		e.Post("/o?panic=1", "k2", "")
		mu.Lock()
		defer mu.Unlock()
		// The panic passes the logger before gin.Recovery writes the 500.
		if want := []int{201, 201, 422, 200}; !slices.Equal(logged, want) {
			t.Fatalf("logged %v, want %v", logged, want)
		}
	})
}

// The writer is a complete gin.ResponseWriter: none of its methods panics
// on an httptest.ResponseRecorder (Gin's own CloseNotify and Hijack do).
func TestWriterOnRecorder(t *testing.T) {
	m := conformance.NewMiddleware(t)
	r := gin.New()
	r.POST("/o", ginidem.Middleware(m), func(c *gin.Context) {
		w := c.Writer
		check := func(what string, ok bool) {
			if !ok {
				t.Errorf("%s", what)
			}
		}
		check("Pusher is nil", w.Pusher() == nil)
		check("CloseNotify is nil", w.CloseNotify() == nil)
		_, _, err := w.Hijack()
		check("Hijack fails", err != nil)
		check("initial state", w.Status() == 200 && w.Size() == -1 && !w.Written()) // a failed Hijack changes nothing
	})
	r.POST("/w", ginidem.Middleware(m), func(c *gin.Context) {
		w := c.Writer
		if w.Status() != 200 || w.Size() != -1 || w.Written() {
			t.Errorf("initial: %d %d %v", w.Status(), w.Size(), w.Written())
		}
		w.WriteHeader(201)
		w.WriteHeader(0) // ignored, as in Gin
		w.WriteHeaderNow()
		w.WriteHeader(500) // ignored: the status is out
		if w.Status() != 201 || w.Size() != 0 || !w.Written() {
			t.Errorf("after WriteHeaderNow: %d %d %v", w.Status(), w.Size(), w.Written())
		}
		w.Write([]byte("ab"))
		w.WriteString("cd")
		w.Flush()
		if w.Size() != 4 {
			t.Errorf("Size %d", w.Size())
		}
		if _, _, err := w.Hijack(); err == nil {
			t.Error("Hijack after the body succeeded")
		}
		if u, ok := w.(interface{ Unwrap() http.ResponseWriter }); !ok || u.Unwrap() == nil {
			t.Error("no Unwrap")
		}
		if err := http.NewResponseController(w).Flush(); err != nil {
			t.Errorf("ResponseController.Flush: %v", err)
		}
	})
	for _, path := range []string{"/o", "/w"} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, path, nil)
		req.Header.Set("Idempotency-Key", "k")
		r.ServeHTTP(rec, req)
		if path == "/w" && (rec.Code != 201 || rec.Body.String() != "abcd" || !rec.Flushed) {
			t.Errorf("%s: %d %q flushed=%v", path, rec.Code, rec.Body, rec.Flushed)
		}
	}
}

// A Gin middleware before idem's sets a header for each request (a request
// id): a replay carries the retry's own, not the first request's, and the
// handler's headers as recorded.
func TestOuterHeaderNotReplayed(t *testing.T) {
	eachStore(t, func(t *testing.T, open opener) {
		var n atomic.Int64
		e := open(func(r *gin.Engine, m *idem.Middleware) {
			r.Use(func(c *gin.Context) {
				c.Header("X-Request-Id", "req-"+strconv.FormatInt(n.Add(1), 10))
				c.Next()
			}, ginidem.Middleware(m))
			r.POST("/o", func(c *gin.Context) {
				c.Header("X-Order", "42")
				c.JSON(http.StatusCreated, gin.H{"id": 42})
			})
		})
		first := e.Post("/o", "k", "")
		conformance.WantOwnHeaders(t, first, e.Post("/o", "k", ""))
	})
}

// failingHijacker is a server writer that can hijack in principle but
// refuses: its Hijack returns an error (a wrapper whose own writer cannot,
// a connection already taken over).
type failingHijacker struct{ *httptest.ResponseRecorder }

func (failingHijacker) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return nil, nil, errors.New("hijack refused")
}

// A Hijack that fails sends nothing: the handler may still answer, and the
// status it then sets is what the client gets, what c.Writer reports (to
// the handler and to the middleware before idem's), what is recorded and
// what the retry replays.
func TestStatusAfterFailedHijack(t *testing.T) {
	writers := []struct {
		name string
		wrap func(*httptest.ResponseRecorder) http.ResponseWriter
	}{
		{"writer cannot hijack", func(rec *httptest.ResponseRecorder) http.ResponseWriter { return rec }},
		{"hijack returns an error", func(rec *httptest.ResponseRecorder) http.ResponseWriter { return failingHijacker{rec} }},
	}
	answers := []struct {
		name, body, contentType string
		status                  int
		committed               bool // the status went out before the Hijack
		answer                  func(c *gin.Context)
	}{
		{"c.JSON(201)", `{"id":1}`, "application/json; charset=utf-8", 201, false, func(c *gin.Context) { c.JSON(http.StatusCreated, gin.H{"id": 1}) }},
		{"c.Status(201)", "", "", 201, false, func(c *gin.Context) { c.Status(http.StatusCreated) }}, // bodyless: sent after the chain
		{"WriteHeaderNow(202) before", "queued", "text/plain", 202, true, func(c *gin.Context) { c.Writer.WriteString("queued") }},
	}
	for _, wr := range writers {
		for _, a := range answers {
			t.Run(wr.name+"/"+a.name, func(t *testing.T) {
				m := conformance.NewMiddleware(t)
				var runs atomic.Int64
				var logged []int
				r := gin.New()
				r.Use(func(c *gin.Context) {
					c.Next()
					logged = append(logged, c.Writer.Status())
				})
				r.POST("/o", ginidem.Middleware(m), func(c *gin.Context) {
					runs.Add(1)
					wantSize := -1
					if a.committed {
						c.Header("Content-Type", "text/plain")
						c.Status(a.status)
						c.Writer.WriteHeaderNow()
						wantSize = 0
					}
					if _, _, err := c.Writer.Hijack(); err == nil {
						t.Fatal("Hijack succeeded")
					}
					if c.Writer.Written() != a.committed || c.Writer.Size() != wantSize {
						t.Errorf("after the failed Hijack: Written %v, Size %d, want %v, %d", c.Writer.Written(), c.Writer.Size(), a.committed, wantSize)
					}
					a.answer(c)
					if s := c.Writer.Status(); s != a.status {
						t.Errorf("c.Writer.Status() = %d, want %d", s, a.status)
					}
				})
				post := func() *httptest.ResponseRecorder {
					rec := httptest.NewRecorder()
					req := httptest.NewRequest(http.MethodPost, "/o", strings.NewReader("{}"))
					req.Header.Set("Idempotency-Key", "k")
					r.ServeHTTP(wr.wrap(rec), req)
					return rec
				}
				for i, want := range []string{"", "true"} {
					rec := post()
					if rec.Code != a.status || rec.Body.String() != a.body ||
						rec.Header().Get("Content-Type") != a.contentType || rec.Header().Get("Idempotent-Replayed") != want {
						t.Errorf("request %d: %d %q %q replayed=%q, want %d %q %q replayed=%q", i+1, rec.Code,
							rec.Header().Get("Content-Type"), rec.Body, rec.Header().Get("Idempotent-Replayed"), a.status, a.contentType, a.body, want)
					}
				}
				if n := runs.Load(); n != 1 {
					t.Errorf("handler ran %d times, want 1", n)
				}
				if want := []int{a.status, a.status}; !slices.Equal(logged, want) {
					t.Errorf("outer middleware saw c.Writer.Status() %v, want %v", logged, want)
				}
			})
		}
	}
}
