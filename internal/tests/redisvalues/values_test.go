package redisvalues_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/leakcheck"
	"github.com/idemkit/idem/internal/redistest"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/idemkit/idem/storage/rueidisstore"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// TestMain stops the redis-servers the tests started and fails the run if
// a goroutine leaked.
func TestMain(m *testing.M) { leakcheck.Main(redistest.Wrap(m)) }

// A key under which Redis holds something that is not an idem entry (a
// hash, a list, a string someone else wrote) is not an outage: the
// request gets 500 ErrCorruptRecord, without Retry-After (a retry cannot
// do better), the handler does not run, not even WithFailOpen (the store
// works; the key is unusable), the observer is told, and the value is
// left alone. On the main before this fix it got 503 ErrStoreUnavailable
// with Retry-After: 1, so clients retried forever.
func TestValueNotAnEntry(t *testing.T) {
	for _, server := range []struct {
		name string
		addr func(t *testing.T) string
	}{
		{"miniredis", func(t *testing.T) string { return miniredis.RunT(t).Addr() }},
		{"redis-server", func(t *testing.T) string { return redistest.Addr(t) }},
	} {
		t.Run(server.name, func(t *testing.T) {
			addr := server.addr(t)
			rdb := redis.NewClient(&redis.Options{Addr: addr})
			t.Cleanup(func() { rdb.Close() })
			rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(rc.Close)
			for _, s := range []struct {
				name  string
				store storage.Store
			}{
				{"redisstore", redisstore.New(rdb)},
				{"rueidisstore", rueidisstore.New(rc)},
			} {
				t.Run(s.name, func(t *testing.T) { testValueNotAnEntry(t, rdb, s.store) })
			}
		})
	}
}

func testValueNotAnEntry(t *testing.T, rdb *redis.Client, store storage.Store) {
	ctx := context.Background()
	for _, failOpen := range []bool{false, true} {
		var events []idem.Event
		opts := []idem.Option{idem.WithObserver(func(ev idem.Event) { events = append(events, ev) })}
		if failOpen {
			opts = append(opts, idem.WithFailOpen())
		}
		m, err := idem.New(store, opts...)
		if err != nil {
			t.Fatal(err)
		}
		var runs atomic.Int64
		mux := http.NewServeMux()
		mux.Handle("POST /orders", nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			w.WriteHeader(http.StatusCreated)
		})))
		for _, v := range []struct {
			kind string
			put  func(key string) error
		}{
			{"hash", func(key string) error { return rdb.HSet(ctx, key, "f", "v").Err() }},
			{"list", func(key string) error { return rdb.RPush(ctx, key, "a", "b").Err() }},
			{"string", func(key string) error { return rdb.Set(ctx, key, "someone else's", 0).Err() }},
		} {
			key := "k-" + v.kind + "-" + t.Name()
			rkey := "idem:" + idem.StorageKey("", http.MethodPost, "POST /orders", key)
			rdb.Del(ctx, rkey)
			if err := v.put(rkey); err != nil {
				t.Fatal(err)
			}
			events = events[:0]
			r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader("{}"))
			r.Header.Set("Idempotency-Key", key)
			w := httptest.NewRecorder()
			mux.ServeHTTP(w, r)
			var p struct {
				Type   string
				Status int
			}
			json.Unmarshal(w.Body.Bytes(), &p)
			if w.Code != http.StatusInternalServerError || w.Header().Get("Content-Type") != "application/problem+json" ||
				!strings.HasSuffix(p.Type, "#ErrCorruptRecord") || p.Status != 500 {
				t.Errorf("fail open %v, a %s under the key: %d %s %s, want 500 problem+json ErrCorruptRecord",
					failOpen, v.kind, w.Code, w.Header().Get("Content-Type"), w.Body)
			}
			if ra := w.Header().Get("Retry-After"); ra != "" {
				t.Errorf("fail open %v, a %s under the key: Retry-After %q, want none", failOpen, v.kind, ra)
			}
			if n := runs.Load(); n != 0 {
				t.Errorf("fail open %v, a %s under the key: handler ran %d times", failOpen, v.kind, n)
			}
			if len(events) != 1 || events[0].Outcome != idem.StoreError || !errors.Is(events[0].Err, storage.ErrCorrupt) {
				t.Errorf("fail open %v, a %s under the key: events %+v, want one store-error wrapping storage.ErrCorrupt", failOpen, v.kind, events)
			}
			if typ := rdb.Type(ctx, rkey).Val(); typ != v.kind {
				t.Errorf("a %s under the key: now a %q", v.kind, typ)
			}
		}
		if err := m.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
