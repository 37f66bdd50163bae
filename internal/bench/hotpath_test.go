package bench

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/response"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/memstore"
)

// These tests hold the behaviour that the allocation-lean hot path must
// keep: the shared heartbeat timer, the lazily armed finish context and
// the replay straight from the encoded record.

// spy counts Extend calls and checks the context of Complete.
type spy struct {
	storage.Store
	extends   atomic.Int64
	completed func(ctx context.Context)
}

func (s *spy) Extend(ctx context.Context, key, owner string, lease time.Duration) error {
	s.extends.Add(1)
	return s.Store.Extend(ctx, key, owner, lease)
}

func (s *spy) Complete(ctx context.Context, key, owner string, rec []byte, ttl time.Duration) error {
	if s.completed != nil {
		s.completed(ctx)
	}
	return s.Store.Complete(ctx, key, owner, rec, ttl)
}

func TestHeartbeatRenewsOnlyWhileTheHandlerRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memstore.New()
		defer mem.Close()
		s := &spy{Store: mem}
		m, err := idem.New(s, idem.WithLease(300*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(350 * time.Millisecond) // due at 100, 200 and 300 ms
			io.WriteString(w, "slow")
		}))
		quick := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
		post := func(h http.Handler, key string) *httptest.ResponseRecorder {
			w := httptest.NewRecorder()
			r := httptest.NewRequest(http.MethodPost, "/o", nil)
			r.Header.Set("Idempotency-Key", key)
			h.ServeHTTP(w, r)
			return w
		}
		for i := range 5 { // short handlers never renew
			post(quick, "quick"+string(rune('a'+i)))
		}
		if n := s.extends.Load(); n != 0 {
			t.Fatalf("%d renewals for handlers shorter than lease/3", n)
		}
		if w := post(h, "slow"); w.Body.String() != "slow" {
			t.Fatalf("slow handler: %d %q", w.Code, w.Body)
		}
		if n := s.extends.Load(); n != 3 {
			t.Fatalf("%d renewals during 350ms with a 300ms lease, want 3", n)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if n := s.extends.Load(); n != 3 {
			t.Fatalf("%d renewals after the handler returned, want still 3", n)
		}
		if w := post(h, "slow"); w.Header().Get(response.ReplayedHeader) != "true" {
			t.Fatalf("no replay after a renewed execution: %d", w.Code)
		}
	})
}

type ctxKey struct{}

func TestFinishContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memstore.New()
		defer mem.Close()
		var done <-chan struct{}
		var ctxSeen context.Context
		s := &spy{Store: mem, completed: func(ctx context.Context) {
			ctxSeen = ctx
			if d, ok := ctx.Deadline(); !ok || d.Sub(time.Now()) != time.Minute {
				t.Errorf("deadline %v %v, want the lease from now", d, ok)
			}
			if ctx.Value(ctxKey{}) != "v" {
				t.Error("the request's values are lost")
			}
			done = ctx.Done()
			if ctx.Err() != nil {
				t.Errorf("Err %v before the deadline, with the client gone", ctx.Err())
			}
			if context.Cause(ctx) != nil {
				t.Errorf("Cause %v: the request's cancellation leaked in", context.Cause(ctx))
			}
		}}
		m, _ := idem.New(s, idem.WithLease(time.Minute))
		rctx, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
		h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			cancel() // the client goes away before the finish
			io.WriteString(w, "x")
		}))
		r := httptest.NewRequestWithContext(rctx, http.MethodPost, "/o", strings.NewReader("body"))
		r.Header.Set("Idempotency-Key", "k")
		h.ServeHTTP(httptest.NewRecorder(), r)
		if ctxSeen == nil {
			t.Fatal("Complete was not called")
		}
		select {
		case <-done:
		default:
			t.Fatal("Done still open after the store call returned")
		}
		if !errors.Is(ctxSeen.Err(), context.Canceled) {
			t.Fatalf("Err after the call %v, want Canceled", ctxSeen.Err())
		}
	})
}

func TestReplayBinaryMatchesReplay(t *testing.T) {
	recs := map[string]response.Record{
		"plain":     {Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/o/1"}}, Body: orderJSON},
		"empty":     {Status: 204, Header: http.Header{"X-A": {"1", "2"}, "Content-Type": nil}},
		"no header": {Status: 200, Body: []byte("x")},
		"trailers": {Status: 200, Header: http.Header{"Trailer": {"X-Sum"}, "Idempotent-Replayed": {"no"}},
			Trailer: http.Header{"X-Sum": {"abc"}, "X-Late": {"1", "2"}}, Body: []byte("body")},
		"not replayable": {Status: 201, NotReplayable: true},
	}
	for name, rec := range recs {
		t.Run(name, func(t *testing.T) {
			data, err := rec.MarshalBinary()
			if err != nil {
				t.Fatal(err)
			}
			var dec response.Record
			if err := dec.UnmarshalBinary(data); err != nil {
				t.Fatal(err)
			}
			want, got := httptest.NewRecorder(), httptest.NewRecorder()
			want.Header().Set("Transfer-Encoding", "")
			got.Header().Set("Transfer-Encoding", "")
			werr := response.Replay(want, &dec)
			status, gerr := response.ReplayBinary(got, data)
			if !errors.Is(gerr, werr) && gerr != werr {
				t.Fatalf("error %v, want %v", gerr, werr)
			}
			if status != rec.Status {
				t.Fatalf("status %d, want %d", status, rec.Status)
			}
			if want.Code != got.Code || want.Body.String() != got.Body.String() {
				t.Fatalf("got %d %q, want %d %q", got.Code, got.Body, want.Code, want.Body)
			}
			if w, g := want.Result().Header, got.Result().Header; !sameHeader(w, g) {
				t.Fatalf("header %v, want %v", g, w)
			}
			if w, g := want.Result().Trailer, got.Result().Trailer; !sameHeader(w, g) {
				t.Fatalf("trailer %v, want %v", g, w)
			}
		})
	}
	if status, err := response.ReplayBinary(httptest.NewRecorder(), []byte{1, 0, 0xff}); status != 0 || !errors.Is(err, response.ErrCorrupt) {
		t.Fatalf("corrupt: %d %v", status, err)
	}
}

func sameHeader(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, va := range a {
		vb, ok := b[k]
		if !ok || strings.Join(va, "\x00") != strings.Join(vb, "\x00") || (va == nil) != (vb == nil) {
			return false
		}
	}
	return true
}
