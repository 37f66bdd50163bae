package conformance

import (
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/idemkit/idem"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/redis/go-redis/v9"
)

// redisKeyRE is every Redis key name the store may write: the prefix and
// 22 characters of base64url, so no byte of a client's key or credentials.
var redisKeyRE = regexp.MustCompile(`^idem:[A-Za-z0-9_-]{22}$`)

// TestRedisKeyNamesHoldNoClientByte sends keys made of what means
// something to Redis (hash tags, the ':' convention, glob patterns, spaces,
// the store's own prefix, the longest keys), from two principals whose
// scopes differ only in where ':' falls, through the Redis store
// (miniredis): one Redis key per record, and every name is the prefix and
// a digest.
func TestRedisKeyNamesHoldNoClientByte(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	m, err := idem.New(redisstore.New(rdb), idem.WithoutFingerprint(), idem.WithScope(func(r *http.Request) string { return r.Header.Get("X-Tenant") }))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.Header.Get("X-Tenant"))
	})))
	defer srv.Close()

	tenants := []string{"t:1", "t"}
	keys := []string{"x", "1:x", "{a}", "{a}:b", "a:{b}", "{}", "::", "*", "idem:*", "idem:a", "[a-z]*", "?", `\*`,
		strings.Repeat("k", 255), strings.Repeat("{", 255), strings.Repeat(":", 255)}
	for _, tenant := range tenants {
		for _, key := range keys {
			req, _ := http.NewRequest("POST", srv.URL+"/o", nil)
			req.Header.Set("Idempotency-Key", key)
			req.Header.Set("X-Tenant", tenant)
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("tenant %q, key %q: %d", tenant, key, resp.StatusCode)
			}
		}
	}
	names := mr.Keys()
	if want := len(tenants) * len(keys); len(names) != want {
		t.Fatalf("%d Redis keys for %d records", len(names), want)
	}
	for _, k := range names {
		if !redisKeyRE.MatchString(k) {
			t.Fatalf("Redis key %q is not the prefix and 22 base64url characters", k)
		}
	}
}
