package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// The values of the naive floors: what a store that kept a plain string
// per key would write, an in-flight marker about as long as idem's
// processing entry, then a record of 512 bytes.
var (
	markerValue = strings.Repeat("p", 56)
	recordValue = strings.Repeat("r", 512)
)

// naive is a client's plain commands, for the naive floors: a first
// execution's two round trips (SET NX PX, then SET PX of the record) and
// a replay's one (GET).
type naive struct {
	first  func(ctx context.Context, key string) error
	replay func(ctx context.Context, key string) (string, error)
}

// redisFloors serves, on mux, the naive floors on the Redis at addr: for
// go-redis and for rueidis (which pipelines concurrent commands into
// shared writes), POST /<client>/first and /<client>/replay, handlers
// that make those round trips for the request's Idempotency-Key and then
// answer as the protected handler does, with no script and no idem. It
// returns the clients' commands by name, for phases that call them
// without HTTP (their keys under the prefix key), and the function that
// closes the clients and deletes their keys.
// Each client's pool, or pipeline, is sized for concurrency clients, as
// the store's client is.
func redisFloors(mux *http.ServeMux, addr string, concurrency int, lease, ttl time.Duration, sent *sentCounter) (map[string]naive, func(string) string, func(), error) {
	prefix := fmt.Sprintf("idem-loadtest-floor:%d:", time.Now().UnixNano())
	gr := redis.NewClient(&redis.Options{Addr: addr, PoolSize: concurrency + 4})
	ru, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		gr.Close()
		return nil, nil, nil, fmt.Errorf("rueidis: %w", err)
	}
	gr.AddHook(sent)
	ru = countRueidis(ru, sent)
	clients := map[string]naive{
		"go-redis": {
			first: func(ctx context.Context, k string) error {
				ok, err := gr.SetNX(ctx, k, markerValue, lease).Result()
				if err == nil && !ok {
					err = fmt.Errorf("SET NX of a new key %s answered nil", k)
				}
				if err != nil {
					return err
				}
				return gr.Set(ctx, k, recordValue, ttl).Err()
			},
			replay: func(ctx context.Context, k string) (string, error) { return gr.Get(ctx, k).Result() },
		},
		"rueidis": {
			first: func(ctx context.Context, k string) error {
				err := ru.Do(ctx, ru.B().Set().Key(k).Value(markerValue).Nx().PxMilliseconds(lease.Milliseconds()).Build()).Error()
				if rueidis.IsRedisNil(err) {
					err = fmt.Errorf("SET NX of a new key %s answered nil", k)
				}
				if err != nil {
					return err
				}
				return ru.Do(ctx, ru.B().Set().Key(k).Value(recordValue).PxMilliseconds(ttl.Milliseconds()).Build()).Error()
			},
			replay: func(ctx context.Context, k string) (string, error) {
				return ru.Do(ctx, ru.B().Get().Key(k).Build()).ToString()
			},
		},
	}
	for name, c := range clients {
		mux.HandleFunc("POST /"+name+"/first", func(w http.ResponseWriter, r *http.Request) {
			if err := c.first(r.Context(), prefix+r.Header.Get("Idempotency-Key")); err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
			handler(w, r)
		})
		mux.HandleFunc("POST /"+name+"/replay", func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			k := prefix + r.Header.Get("Idempotency-Key")
			v, err := c.replay(r.Context(), k)
			if err == redis.Nil || rueidis.IsRedisNil(err) {
				// The replay phase's keys are stored first, once each.
				if err = c.first(r.Context(), k); err == nil {
					v = recordValue
				}
			}
			if err != nil || len(v) != len(recordValue) {
				http.Error(w, fmt.Sprintf("GET answered %d bytes: %v", len(v), err), http.StatusBadGateway)
				return
			}
			h := w.Header()
			h.Set("Content-Type", "application/json")
			h.Set("Location", "/orders/42")
			h.Set("X-Request-Id", "2f1c7a9e-6f7d-4a8e-9f55-0d3c1b2a4e6f")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, v)
		})
	}
	key := func(k string) string { return prefix + k }
	return clients, key, func() {
		deleteKeys(gr, prefix)
		ru.Close()
		gr.Close()
	}, nil
}
