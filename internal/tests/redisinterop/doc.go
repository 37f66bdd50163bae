// Package redisinterop holds the tests that storage/redisstore (on
// go-redis) and storage/rueidisstore (on rueidis) share their entries: on
// the same Redis, under the same prefix, an entry written by one store is
// read and finished by the other, in each direction, so that a service
// can move from one client to the other, or run both during a deploy. It
// has no code of its own.
//
// The tests run on a real redis-server and on a real three-master Redis
// Cluster (internal/redistest: skipped without redis-server, failed when
// IDEM_REQUIRE_REDIS=1).
package redisinterop
