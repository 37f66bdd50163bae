package nethttp_test

import (
	"testing"

	"github.com/idemkit/idem/internal/dynamotest"
	"github.com/idemkit/idem/internal/leakcheck"
	"github.com/idemkit/idem/internal/mysqltest"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/redistest"
)

// TestMain stops the redis-servers and the PostgreSQL, MariaDB and
// dynalite servers the conformance suite started (and removes their data)
// and fails the run if a goroutine leaked (a lease heartbeat, a store's
// janitor).
func TestMain(m *testing.M) {
	leakcheck.Main(dynamotest.Wrap(mysqltest.Wrap(pgtest.Wrap(redistest.Wrap(m)))))
}
