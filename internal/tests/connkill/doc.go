// Package connkill holds the tests that run the middleware on both Redis
// stores (storage/redisstore on go-redis, storage/rueidisstore on
// rueidis) while another client kills their connections again and again
// (CLIENT KILL TYPE normal), and check what every request left behind:
// no key whose request was refused stays locked once the connections
// hold again. It has no code of its own.
//
// The tests run on a real redis-server of their own (internal/redistest:
// skipped without redis-server, failed when IDEM_REQUIRE_REDIS=1).
package connkill
