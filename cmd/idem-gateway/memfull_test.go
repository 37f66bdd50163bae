package main

import (
	"fmt"
	"net/http"
	"testing"
	"time"
)

// The memory store never evicts a record within its TTL: with
// max_entries 2 and two responses stored, a third key gets 503 with
// Retry-After (the upstream is not called), and the two stored responses
// keep being replayed.
func TestProcessMemoryStoreFull(t *testing.T) {
	up := newUpstream(t)
	gw := startGateway(t, gatewayConfig(up.URL, "memory: {max_entries: 2}", "", ""))
	ctx := deadline(t, time.Minute)
	c := &http.Client{}

	first := map[string]answer{}
	for _, key := range []string{"k1", "k2"} {
		a := post(ctx, c, gw.url("/orders"), key, `{}`)
		if a.status != http.StatusCreated {
			t.Fatalf("%s: %v, want 201", key, a)
		}
		first[key] = a
	}
	// The records are stored once the answers went out (settled retries
	// while they are not): now both places are taken by done records.
	for key, a := range first {
		if r := settled(ctx, c, gw.url("/orders"), key, `{}`); !r.replayed || r.body != a.body {
			t.Fatalf("%s retried: %v, want %v replayed", key, r, a)
		}
	}
	for i := range 2 {
		a := post(ctx, c, gw.url("/orders"), fmt.Sprint("k3-", i), `{}`)
		if a.status != http.StatusServiceUnavailable || a.header.Get("Retry-After") == "" {
			t.Fatalf("a new key on a full store: %v (Retry-After %q), want 503 with Retry-After", a, a.header.Get("Retry-After"))
		}
	}
	for key, a := range first {
		if r := settled(ctx, c, gw.url("/orders"), key, `{}`); !r.replayed || r.body != a.body {
			t.Fatalf("%s retried after the store was full: %v, want %v replayed", key, r, a)
		}
	}
	if n := up.executions(); n != 2 {
		t.Fatalf("the upstream ran %d times, want 2", n)
	}
}
