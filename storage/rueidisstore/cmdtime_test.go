package rueidisstore_test

import (
	"testing"

	"github.com/idemkit/idem/internal/redistest"
	"github.com/idemkit/idem/storage/internal/redisproto/redisprototest"
)

// BenchmarkCommandTime measures what the store costs Redis itself, by the
// server's own accounting, beside the naive floor of plain commands (see
// redisprototest.CommandTime):
//
//	go test -run '^$' -bench CommandTime -benchtime 20000x ./storage/rueidisstore
func BenchmarkCommandTime(b *testing.B) {
	addr := redistest.Start(b)
	c := client(b, addr)
	h := protocolHarness(c, nil)
	redisprototest.CommandTime(b, h.New(""), h.Do)
}
