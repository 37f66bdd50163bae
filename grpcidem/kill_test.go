package grpcidem_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/grpcidem"
	"github.com/idemkit/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestKill9AcrossProcesses: two server processes share a real Redis. The
// first is killed with SIGKILL while its handler holds a key; the client's
// retry on the second gets Aborted until the dead process's lease runs
// out, then the handler runs there, once; the next retry is its replay.
// The handler's runs are counted in Redis.
func TestKill9AcrossProcesses(t *testing.T) {
	addr := redistest.Addr(t)
	bin := buildTestServer(t)
	prefix := "grpcidem-kill:" + randomHex() + ":"
	const lease = 2 * time.Second // the time the second process waits: long enough to see Aborted first
	args := []string{"-redis", addr, "-prefix", prefix, "-lease", lease.String()}
	first := startServer(t, bin, append(args, "-hold")...)
	second := startServer(t, bin, args...)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	runs := func() string { v, _ := rdb.Get(context.Background(), prefix+"runs").Result(); return v }

	key := "kill-" + randomHex()
	ctx := metadata.AppendToOutgoingContext(testCtx(t), grpcidem.DefaultKeyHeader, key)
	conn1 := dial(t, first.addr)
	held := make(chan error, 1)
	go func() {
		held <- conn1.Invoke(ctx, createMethod, order("book", 12), new(wrapperspb.StringValue))
	}()
	deadline := time.Now().Add(10 * time.Second)
	for runs() != "1" {
		if time.Now().After(deadline) {
			t.Fatalf("the first process's handler did not run (runs %q)", runs())
		}
		time.Sleep(10 * time.Millisecond) // polling Redis
	}
	first.kill()
	killed := time.Now()
	// The dead process's lease, as Redis counts it after the kill: it
	// runs out no earlier than expiry (at once if it ran out before).
	expiry := killed
	keys, err := rdb.Keys(context.Background(), prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if k != prefix+"runs" {
			if pttl := rdb.PTTL(context.Background(), k).Val(); pttl > 0 {
				expiry = killed.Add(pttl)
			}
		}
	}
	if err := within(t, held, "the call to the killed process"); err == nil {
		t.Fatal("the call to the killed process succeeded")
	}

	var attempts []grpcidem.Attempt
	var ended []time.Time // when each attempt had ended
	conn2 := dial(t, second.addr, grpc.WithChainUnaryInterceptor(grpcidem.UnaryClientInterceptor(
		grpcidem.WithMaxAttempts(20),
		grpcidem.WithAttemptHook(func(a grpcidem.Attempt) { attempts, ended = append(attempts, a), append(ended, time.Now()) }),
	)))
	var resp wrapperspb.StringValue
	var header metadata.MD
	if err := conn2.Invoke(ctx, createMethod, order("book", 12), &resp, grpc.Header(&header)); err != nil {
		t.Fatalf("the retry on the second process: %v after attempts %v", err, codesOf(attempts))
	}
	if want := fmt.Sprintf("run 2 by %d", second.cmd.Process.Pid); resp.GetValue() != want || len(header.Get(grpcidem.ReplayedHeader)) != 0 {
		t.Errorf("the retry got %q (header %v), want %q, not replayed", resp.GetValue(), header, want)
	}
	noVerdict := ""
	switch {
	case len(attempts) == 0 || attempts[len(attempts)-1].Code != codes.OK:
		t.Errorf("attempts %v: want Aborted while the lease ran, then OK", codesOf(attempts))
	case attempts[0].Code == codes.Aborted && len(attempts) >= 2:
	case ended[0].Before(expiry):
		t.Errorf("attempts %v: want Aborted while the lease ran (it ran out %v after the kill), then OK",
			codesOf(attempts), expiry.Sub(killed).Round(time.Millisecond))
	default:
		// The retry came after the lease had run out: a loaded machine.
		noVerdict = fmt.Sprintf("the first retry ended %v after the kill, after the dead process's lease had run out (%v after it): "+
			"a loaded machine, no verdict on the Aborted while the lease runs", ended[0].Sub(killed).Round(time.Millisecond),
			expiry.Sub(killed).Round(time.Millisecond))
	}
	if err := conn2.Invoke(ctx, createMethod, order("book", 12), &resp, grpc.Header(&header)); err != nil || header.Get(grpcidem.ReplayedHeader)[0] != "true" {
		t.Errorf("the next retry: %v, header %v; want the replay", err, header)
	}
	if n := runs(); n != "2" {
		t.Errorf("the handler ran %s times, want 2 (the killed run and one on the second process)", n)
	}
	if noVerdict != "" {
		t.Skip(noVerdict)
	}
}

// buildTestServer builds internal/testserver (without -race, to start
// quickly) and returns its path.
func buildTestServer(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command, to build the test server: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "testserver")
	cmd := exec.Command(goBin, "build", "-o", bin, "./internal/testserver")
	cmd.Env = append(os.Environ(), "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./internal/testserver: %v\n%s", err, out)
	}
	return bin
}

// serverProc is a running test server.
type serverProc struct {
	cmd  *exec.Cmd
	addr string
	done chan struct{} // closed once the process was waited for
}

// startServer starts bin with args and returns once it listens; it is
// killed when the test ends.
func startServer(t *testing.T, bin string, args ...string) *serverProc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &serverProc{cmd: cmd, done: make(chan struct{})}
	t.Cleanup(p.kill)
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		for sc.Scan() { // drain until the process ends
		}
		cmd.Wait()
		close(p.done)
	}()
	line := within(t, lines, "the server's address")
	addr, ok := strings.CutPrefix(line, "listening on ")
	if !ok {
		t.Fatalf("the server printed %q", line)
	}
	p.addr = addr
	return p
}

// kill kills the process with SIGKILL and waits for it.
func (p *serverProc) kill() {
	p.cmd.Process.Kill()
	<-p.done
}

// dial returns a connection to addr, closed when the test ends.
func dial(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
