// Package redisvalues holds the tests of the middleware over a Redis key
// that holds something other than an idem entry (a hash, a list, someone
// else's string), on both Redis stores (storage/redisstore on go-redis,
// storage/rueidisstore on rueidis), on miniredis and on a real
// redis-server (internal/redistest: skipped without redis-server, failed
// when IDEM_REQUIRE_REDIS=1). It has no code of its own.
package redisvalues
