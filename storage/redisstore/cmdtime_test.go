package redisstore_test

import (
	"testing"

	"github.com/idemkit/idem/internal/redistest"
	"github.com/idemkit/idem/storage/internal/redisproto/redisprototest"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/redis/go-redis/v9"
)

// BenchmarkCommandTime measures what the store costs Redis itself, by the
// server's own accounting, beside the naive floor of plain commands (see
// redisprototest.CommandTime):
//
//	go test -run '^$' -bench CommandTime -benchtime 20000x ./storage/redisstore
func BenchmarkCommandTime(b *testing.B) {
	addr := redistest.Start(b)
	opt := redisstore.ClientOptions(addr)
	opt.PoolSize = 64
	rdb := redis.NewClient(opt)
	b.Cleanup(func() { rdb.Close() })
	h := protocolHarness(rdb, nil)
	redisprototest.CommandTime(b, h.New(""), h.Do)
}
