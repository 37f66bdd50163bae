// Package bench measures what the idem middleware costs: benchmarks of
// every adapter (nethttp, ginidem, echoidem) on every store (memory, and a
// real redis-server, PostgreSQL server and MariaDB when there are: see
// internal/redistest, internal/pgtest and internal/mysqltest; sqlstore
// runs on MariaDB and on PostgreSQL through database/sql) against the
// same handler without the middleware, the cost of pgstore's and
// sqlstore's Fence in a handler's own transaction (TestFence holds
// their round trips and allocations), the memory store and the
// middleware on it under b.RunParallel (BenchmarkParallel, for -cpu
// 1,2,4,8,16 and a mutex profile), and tests that hold the deterministic
// budgets (store round trips, allocations, bytes per stored record).
//
// The package holds only tests:
//
//	go test ./internal/tests/bench/                            # the budgets
//	go test -run '^$' -bench . -benchtime 1s -count 5 ./internal/tests/bench/ | tee new.txt
//	benchstat new.txt
//
// See docs/performance.md for the figures and how to read them.
package bench
