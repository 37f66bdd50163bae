package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// EnvClusterAddrs names a running Redis Cluster to use instead of starting
// one: the addresses of some of its nodes, separated by commas.
const EnvClusterAddrs = "IDEM_REDIS_CLUSTER_ADDRS"

// ClusterMasters is the number of masters of the cluster ClusterAddrs
// starts.
const ClusterMasters = 3

const noCluster = "redistest: no redis-server or redis-cli on PATH and " + EnvClusterAddrs + " unset"

// cluster is the Redis Cluster that ClusterAddrs starts for the whole test
// binary.
var cluster struct {
	mu    sync.Mutex
	nodes []*server
	dir   string
	err   error // why it could not start; sticky, so it is tried once
	done  bool  // tried
}

// ClusterAddrs returns the addresses of the masters of a real Redis
// Cluster: those in IDEM_REDIS_CLUSTER_ADDRS when it is set, else of a
// cluster of [ClusterMasters] masters and no replicas that ClusterAddrs
// starts on first use (redis-server with cluster-enabled, joined by
// redis-cli --cluster create) and shares with every test of the binary, so
// tests must use keys or prefixes of their own. It returns once every
// node reports cluster_state:ok. It skips or fails the test like [Addr]
// when redis-server or redis-cli is missing. The cluster is stopped by
// [Main] and [Wrap], and on Linux killed when the test binary exits.
//
// Starting the cluster takes a second or two.
func ClusterAddrs(t testing.TB) []string {
	t.Helper()
	if a := os.Getenv(EnvClusterAddrs); a != "" {
		return strings.Split(a, ",")
	}
	cluster.mu.Lock()
	defer cluster.mu.Unlock()
	if !cluster.done {
		cluster.done = true
		cluster.err = startCluster()
	}
	checkCluster(t, cluster.err)
	addrs := make([]string, len(cluster.nodes))
	for i, n := range cluster.nodes {
		addrs[i] = n.addr
	}
	return addrs
}

// checkCluster skips or fails t for a start error, like check.
func checkCluster(t testing.TB, err error) {
	t.Helper()
	switch {
	case err == nil:
	case errors.Is(err, exec.ErrNotFound) && os.Getenv(EnvRequire) != "1":
		t.Skip(noCluster)
	case errors.Is(err, exec.ErrNotFound):
		t.Fatal(noCluster + ", and " + EnvRequire + "=1")
	default:
		t.Fatalf("redistest: cluster: %v", err)
	}
}

// stopCluster stops the shared cluster, if it was started, and removes its
// files.
func stopCluster() {
	cluster.mu.Lock()
	defer cluster.mu.Unlock()
	for _, n := range cluster.nodes {
		n.stop()
	}
	if cluster.dir != "" {
		os.RemoveAll(cluster.dir)
	}
	cluster.nodes, cluster.dir, cluster.err, cluster.done = nil, "", nil, false
}

// startCluster starts the nodes, joins them and waits until the cluster is
// ok. On error it leaves nothing running. The caller holds cluster.mu.
func startCluster() (err error) {
	bin, err := serverBin()
	if err != nil {
		return err
	}
	cli, err := cliBin()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "redistest-cluster-*")
	if err != nil {
		return err
	}
	cluster.dir = dir
	defer func() {
		if err != nil {
			for _, n := range cluster.nodes {
				n.stop()
			}
			os.RemoveAll(dir)
			cluster.nodes, cluster.dir = nil, ""
		}
	}()
	for i := range ClusterMasters {
		n, err := startNode(bin, filepath.Join(dir, strconv.Itoa(i)))
		if err != nil {
			return err
		}
		cluster.nodes = append(cluster.nodes, n)
	}
	args := []string{"--cluster", "create"}
	for _, n := range cluster.nodes {
		args = append(args, n.addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	create := exec.CommandContext(ctx, cli, append(args, "--cluster-replicas", "0", "--cluster-yes")...)
	create.SysProcAttr = sysProcAttr()
	if out, err := create.CombinedOutput(); err != nil {
		return fmt.Errorf("redis-cli --cluster create: %w; its output:\n%s", err, out)
	}
	for _, n := range cluster.nodes {
		if err := waitClusterOK(n.addr, 10*time.Second); err != nil {
			out, _ := os.ReadFile(n.log)
			return fmt.Errorf("node %s: %w; its output:\n%s", n.addr, err, out)
		}
	}
	return nil
}

// startNode starts one cluster node with its files in dir. The cluster bus
// port is chosen freely too (the default, port+10000, may be out of range),
// so a port taken in between makes the server exit; it tries a few times.
func startNode(bin, dir string) (*server, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		bus, err := freePort()
		if err != nil {
			return nil, err
		}
		srv, err := startOn(bin, []string{"--cluster-enabled", "yes", "--cluster-port", strconv.Itoa(bus),
			"--cluster-config-file", filepath.Join(dir, "nodes.conf"), "--dir", dir,
			"--cluster-node-timeout", "5000"})
		if err == nil || attempt == 3 {
			return srv, err
		}
		os.Remove(filepath.Join(dir, "nodes.conf")) // a fresh node identity for the next attempt
	}
}

// waitClusterOK polls CLUSTER INFO on addr until it reports
// cluster_state:ok with every slot assigned and every master known.
func waitClusterOK(addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		info, err := clusterInfo(addr)
		if err == nil && strings.Contains(info, "cluster_state:ok") &&
			strings.Contains(info, "cluster_slots_ok:16384") &&
			strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(ClusterMasters)) {
			return nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("CLUSTER INFO says:\n%s", info)
			}
			return fmt.Errorf("cluster not ok after %v: %w", timeout, err)
		}
		time.Sleep(20 * time.Millisecond) // an external process: nothing to wait on but time
	}
}

// clusterInfo sends CLUSTER INFO and returns the bulk string answered.
func clusterInfo(addr string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("CLUSTER INFO\r\n")); err != nil {
		return "", err
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	if !strings.HasPrefix(line, "$") {
		return "", fmt.Errorf("CLUSTER INFO answered %q", line)
	}
	n, err := strconv.Atoi(strings.TrimSpace(line[1:]))
	if err != nil || n < 0 {
		return "", fmt.Errorf("CLUSTER INFO answered %q", line)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return "", err
	}
	return string(b), nil
}
