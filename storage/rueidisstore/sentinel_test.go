//go:build unix

package rueidisstore_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/redistest"
	"github.com/idemkit/idem/storage/rueidisstore"
	"github.com/idemkit/idem/storage/storagetest"
	"github.com/redis/rueidis"
)

// TestContractSentinel runs the contract suite through a rueidis client
// made the Sentinel way (InitAddress: the sentinels; Sentinel.MasterSet):
// a real master, and a real sentinel that names it.
func TestContractSentinel(t *testing.T) {
	master := redistest.Start(t)
	sentinel := startSentinel(t, "idem", master)
	opt := rueidisstore.ClientOption(sentinel)
	opt.Sentinel.MasterSet = "idem"
	opt.Dialer.KeepAlive, opt.ConnWriteTimeout = time.Second, 10*time.Second
	c, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if m := c.Mode(); m != rueidis.ClientModeSentinel {
		t.Fatalf("client mode %s, want sentinel", m)
	}
	p := prefix("sentinel")
	s := rueidisstore.New(c, rueidisstore.WithPrefix(p))
	storagetest.Run(t, func(t *testing.T) storagetest.Harness {
		return storagetest.Harness{Store: s}
	})
	// The entries are on the master the sentinel names.
	direct := client(t, master)
	if _, err := s.Acquire(t.Context(), "on-master", "o", "fp", time.Minute); err != nil {
		t.Fatal(err)
	}
	if n, err := direct.Do(t.Context(), direct.B().Exists().Key(p+"on-master").Build()).AsInt64(); err != nil || n != 1 {
		t.Fatalf("the master holds %d entries under the key, %v; want 1", n, err)
	}
}

// startSentinel starts a redis-server in sentinel mode on a free loopback
// port, monitoring the master at masterAddr as name, and returns its
// address once it names the master. It is killed, and waited for, when
// the test ends.
func startSentinel(t *testing.T, name, masterAddr string) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv(redistest.EnvRequire) == "1" {
			t.Fatal("no redis-server on PATH")
		}
		t.Skip("no redis-server on PATH")
	}
	host, port, _ := net.SplitHostPort(masterAddr)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	_, sport, _ := net.SplitHostPort(addr)
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	// Sentinel rewrites its configuration file, so it must have one.
	if err := os.WriteFile(conf, []byte("port "+sport+"\nbind 127.0.0.1\ndir "+dir+"\n"+
		"sentinel monitor "+name+" "+host+" "+port+" 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, conf, "--sentinel")
	logf, err := os.Create(filepath.Join(dir, "sentinel.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	// Poll until the sentinel answers with the master's address.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for {
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true, ForceSingleClient: true})
		if err == nil {
			got, err := c.Do(ctx, c.B().Arbitrary("SENTINEL", "GET-MASTER-ADDR-BY-NAME", name).Build()).AsStrSlice()
			c.Close()
			if err == nil && len(got) == 2 && got[0] == host && got[1] == port {
				return addr
			}
		}
		select {
		case <-ctx.Done():
			log, _ := os.ReadFile(filepath.Join(dir, "sentinel.log"))
			t.Fatalf("sentinel on %s did not name the master %s: %v\n%s", addr, masterAddr, err, log)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
