package main

import (
	"testing"

	"github.com/idemkit/idem/internal/dynamotest"
	"github.com/idemkit/idem/internal/leakcheck"
	"github.com/idemkit/idem/internal/mysqltest"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/redistest"
)

// Main stops the shared redis-server, Redis Cluster, PostgreSQL, MariaDB
// and dynalite, and checks for leaked goroutines.
func TestMain(m *testing.M) {
	leakcheck.Main(redistest.Wrap(pgtest.Wrap(mysqltest.Wrap(dynamotest.Wrap(m)))))
}
