package main

import (
	"context"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/idemkit/idem/examples/democlient"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/memstore"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/redis/go-redis/v9"
)

// TestDemo runs what `go run ./examples/metrics -demo` runs, on the memory
// store and on Redis, and checks the metrics it printed: the order counted
// once as executed, its duplicate as a conflict and its retry as replayed,
// on the route, with the handler's duration, the store's calls and the
// executions under way.
func TestDemo(t *testing.T) {
	for _, c := range []struct {
		name  string
		store func(t *testing.T) storage.Store
	}{
		{"memory", func(t *testing.T) storage.Store {
			s := memstore.New()
			t.Cleanup(func() { s.Close() })
			return s
		}},
		{"redis", func(t *testing.T) storage.Store {
			rdb := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
			t.Cleanup(func() { rdb.Close() })
			return redisstore.New(rdb)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, m, err := newServer(c.store(t), democlient.NewClicks())
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(h)
			defer func() {
				srv.Close()
				if err := m.Shutdown(context.Background()); err != nil {
					t.Error(err)
				}
			}()
			var out strings.Builder
			if err := play(&out, srv.URL, democlient.RunID()); err != nil {
				t.Fatalf("%v\ntranscript:\n%s", err, out.String())
			}
			got := out.String()
			requests := func(outcome string) float64 {
				return value(t, got, "idem_requests_total", `http_request_method="POST"`, `http_route="/orders"`, `idem_outcome="`+outcome+`"`)
			}
			if n := requests("executed"); n != 1 {
				t.Errorf("executed: %v, want 1", n)
			}
			if n := requests("conflict"); n < 1 {
				t.Errorf("conflict: %v, want at least 1", n)
			}
			if n := requests("replayed"); n < 1 {
				t.Errorf("replayed: %v, want at least 1", n)
			}
			if n := value(t, got, "idem_handler_duration_seconds_count", `http_route="/orders"`, `idem_outcome="executed"`); n != 1 {
				t.Errorf("handler durations: %v, want 1", n)
			}
			for _, op := range []string{"acquire", "complete"} {
				if n := value(t, got, "idem_store_operation_duration_seconds_count", `idem_store="`+c.name+`"`, `idem_store_operation="`+op+`"`); n < 1 {
					t.Errorf("store %s: %v calls, want at least 1", op, n)
				}
			}
			if n := value(t, got, "idem_executions_active"); n != 0 {
				t.Errorf("executions active: %v, want 0", n)
			}
			if t.Failed() {
				t.Logf("transcript:\n%s", got)
			}
		})
	}
}

// value returns the value of the series of metric whose labels include
// each of labels (name="value") in the exposition text, failing t when
// there is not exactly one.
func value(t *testing.T, text, metric string, labels ...string) float64 {
	t.Helper()
	series := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(metric) + `(\{[^}]*\})? (\S+)$`)
	var found []float64
	for _, m := range series.FindAllStringSubmatch(text, -1) {
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(m[1], l)
		}
		if ok {
			v, err := strconv.ParseFloat(m[2], 64)
			if err != nil {
				t.Fatalf("%s: %v", m[0], err)
			}
			found = append(found, v)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d series of %s with %v, want 1", len(found), metric, labels)
	}
	return found[0]
}
