//go:build unix

package redistest

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Sentinel starts a redis-server in sentinel mode on a free loopback
// port, monitoring the master at masterAddr as name, and returns its
// address once it names the master. It is killed, and waited for, when
// the test ends. It skips or fails the test like [Addr] without
// redis-server.
func Sentinel(t testing.TB, name, masterAddr string) string {
	t.Helper()
	bin, err := serverBin()
	if err != nil {
		check(t, fmt.Errorf("no redis-server on PATH"))
	}
	host, port, _ := net.SplitHostPort(masterAddr)
	sport, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sport))
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	// Sentinel rewrites its configuration file, so it must have one.
	if err := os.WriteFile(conf, fmt.Appendf(nil, "port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor %s %s %s 1\n",
		sport, dir, name, host, port), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, conf, "--sentinel")
	cmd.SysProcAttr = sysProcAttr()
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
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := masterByName(addr, name)
		if err == nil && got == net.JoinHostPort(host, port) {
			return addr
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "sentinel.log"))
			t.Fatalf("sentinel on %s did not name the master %s (%q, %v):\n%s", addr, masterAddr, got, err, log)
		}
		time.Sleep(20 * time.Millisecond) // an external process: nothing to wait on but time
	}
}

// masterByName asks the sentinel at addr for the master it names name.
func masterByName(addr, name string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := fmt.Fprintf(c, "SENTINEL GET-MASTER-ADDR-BY-NAME %s\r\n", name); err != nil {
		return "", err
	}
	r := bufio.NewReader(c)
	head, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	if head != "*2\r\n" {
		return "", fmt.Errorf("answered %q", head)
	}
	var parts [2]string
	for i := range parts {
		if _, err := r.ReadString('\n'); err != nil { // $len
			return "", err
		}
		v, err := r.ReadString('\n')
		if err != nil {
			return "", err
		}
		parts[i] = strings.TrimSuffix(v, "\r\n")
	}
	return net.JoinHostPort(parts[0], parts[1]), nil
}
