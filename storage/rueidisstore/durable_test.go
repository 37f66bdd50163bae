package rueidisstore_test

import (
	"net"
	"testing"

	"github.com/idemkit/idem/internal/redistest"
	"github.com/idemkit/idem/storage/internal/redisproto"
	"github.com/idemkit/idem/storage/internal/redisproto/redisprototest"
	"github.com/idemkit/idem/storage/rueidisstore"
)

// TestDurability runs WithDurability against a real replica: WAIT on the
// server redistest starts (Redis 7.0 here, Valkey in CI's second pass),
// and WAITAOF on Valkey, both with their append-only file on.
func TestDurability(t *testing.T) {
	// No delay before the replica's first sync (5 s by default).
	fast := []string{"--repl-diskless-sync-delay", "0"}
	t.Run("wait", func(t *testing.T) {
		primary := redistest.StartProc(t, append(fast, "--dir", t.TempDir())...)
		host, port, _ := net.SplitHostPort(primary.Addr())
		replica := redistest.StartProc(t, "--replicaof", host, port, "--dir", t.TempDir()) // it saves what it syncs
		testDurability(t, primary.Addr(), replica, false)
	})
	t.Run("waitaof", func(t *testing.T) {
		primary := redistest.StartValkeyProc(t, append(fast, "--appendonly", "yes", "--appendfsync", "always", "--dir", t.TempDir())...)
		host, port, _ := net.SplitHostPort(primary.Addr())
		replica := redistest.StartValkeyProc(t, "--replicaof", host, port, "--appendonly", "yes", "--appendfsync", "always", "--dir", t.TempDir())
		testDurability(t, primary.Addr(), replica, true)
	})
}

// testDurability runs redisprototest.RunDurable on primary and replica.
// The replica is stopped by SIGSTOP: still connected, it no longer
// acknowledges, so that a wait sent on a connection that did not write
// (which counts the replicas' acknowledgements of nothing) would pass,
// and the test catch it.
func testDurability(t *testing.T, primary string, replica *redistest.Proc, aof bool) {
	server := func(addr string) redisprototest.Server { return protocolHarness(client(t, addr), nil).Do }
	redisprototest.RunDurable(t, redisprototest.Durable{
		New: func(d redisproto.Durability) redisprototest.Store {
			return rueidisstore.New(client(t, primary), rueidisstore.WithDurability(d))
		},
		Primary:     server(primary),
		Replica:     server(replica.Addr()),
		StopReplica: replica.Pause,
		AOF:         aof,
	})
}
