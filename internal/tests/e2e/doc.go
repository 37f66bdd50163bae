// Package e2e holds end-to-end tests of the kit's guarantees with real
// processes on loopback: several idemserver processes (a net/http
// application protected by idem on redisstore, or on rueidisstore with
// -client rueidis, built from ./idemserver without -race; the Redis tests
// of exactlyonce, crash and outage run once for each client) share real redis-servers, a bounded client in the test
// sends duplicates across them, and the tests kill processes (kill -9),
// stall Redis (SIGSTOP/SIGCONT) and kill and restart it. Every execution
// of the handler is counted outside the middleware, in a Redis hash per
// key with one field per execution, named by the execution's own id
// (process id and sequence number in the process), so "exactly once" is
// checked by counting distinct executions: a record sent again (go-redis
// resends a command after a read timeout) does not count twice, a second
// execution in any process does. Every replay is compared byte for byte
// with the response of the execution it replays. count_test.go tests
// that count, with servers that record every execution twice and with a
// store broken on purpose. shutdown_test.go deploys a process under load
// (SIGTERM) while the store is down: its shutdown, http.Server.Shutdown
// then Middleware.Shutdown, must store every record before it exits, and
// the same test must fail with a shutdown that does not wait.
//
// client_test.go sends its requests through the client half of the
// protocol, idemclient's Transport, with a TCP proxy of the test's own in
// front of the processes (one address, as a load balancer gives; it can
// cut a connection after reading the server's whole response), and
// breaks things under a call: the process running the request is killed
// before the handler's effect (-gate-at before-count) or after its record
// is stored (-gate-at after-store) and a new process takes over; the
// connection is cut after the server committed; duplicates with one key
// arrive while the first runs; the store's Redis is killed or stopped.
// Each checks what the caller sees (status, Idempotent-Replayed, body
// byte for byte, idemclient.Result), every attempt as it went out (one
// key, the Retry-After waited) and every execution in the count server,
// under any key. It runs on the memory store (idemserver -memory) where
// one process suffices, and on Redis.
//
// pg_test.go runs the same servers on PostgreSQL (idemserver -pg, a
// private server from internal/pgtest): the handler commits an order row
// and idem's fence in one transaction, and the tests count order rows per
// key, with three processes, a process killed after its commits, one
// stopped past its leases, and the database crashed under load. Each runs
// twice, as the subtests pgstore (pgx) and sqlstore (idemserver -pg-store
// sqlstore: database/sql, pgx's stdlib driver and sqlstore.PostgreSQL).
// mysql_test.go runs them on MariaDB (idemserver -mysql: database/sql,
// go-sql-driver/mysql and sqlstore.MySQL, the server from
// internal/mysqltest, IDEM_REQUIRE_MYSQL=1): three processes, a process
// killed after its commits, one stopped past its leases, and the
// database killed (SIGKILL of mariadbd) under load and restarted.
//
// The tests and what they prove are listed in docs/guarantees.md, with the
// figures of the last run. They need redis-server on PATH (they skip
// without it, or fail when IDEM_REQUIRE_REDIS=1), PostgreSQL's server
// binaries for pg_test.go (see internal/pgtest; IDEM_REQUIRE_PG=1) and the
// go command, to
// build the server once per test binary. Environment variables:
//
//	IDEM_E2E_KEYS=10000   keys of TestExactlyOnceAcrossProcesses and
//	                      TestPGExactlyOnceAcrossProcesses (default 2000)
//	IDEM_E2E_MYSQL_KEYS   keys of TestMySQLExactlyOnceAcrossProcesses
//	                      (default 1000)
//	IDEM_E2E_DUPS=5       concurrent duplicates of each key (default 5)
//	IDEM_E2E_WORKERS=64   requests in flight (default 64; 32 in
//	                      TestMySQLExactlyOnceAcrossProcesses)
//	IDEM_E2E_FIGURES=f    append the figures of the run to the file f
//	IDEM_E2E_PG_SETTINGS="synchronous_commit=off"
//	                      settings of the PostgreSQL of
//	                      TestPGRestartFailsClosed, to test it: a server that
//	                      loses acknowledged commits in a crash fails it
//	IDEM_E2E_MYSQL_SETTINGS="innodb_flush_log_at_trx_commit=0"
//	                      settings of the MariaDB of
//	                      TestMySQLRestartFailsClosed and
//	                      TestMySQLProcCrashKeepsCommits, to test them
//	IDEM_E2E_SERVER_FLAGS="-steal-leases"
//	                      more flags for every idemserver: -steal-leases
//	                      breaks the store on purpose, so that the tests
//	                      fail; -record-twice sends every execution's
//	                      record twice, which they must not notice;
//	                      -no-fence commits the orders without the fence,
//	                      which the tests of a crash or a stale execution
//	                      (PostgreSQL and MariaDB) must notice
//	IDEM_E2E_CLIENT=rotate-keys
//	                      breaks the client of client_test.go on purpose:
//	                      every attempt goes out under a new key, and the
//	                      tests fail
//
// A larger run:
//
//	IDEM_E2E_KEYS=10000 go test -count=1 -v -run TestExactlyOnceAcrossProcesses ./internal/e2e/
package e2e
