package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/redistest"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/redis/go-redis/v9"
)

// TestDemo runs the demo on miniredis, and on a real redis-server (twice,
// as runs follow one another on one Redis), and checks its ledger: each
// payment credited once, alice's crashed entry replayed by another
// consumer.
func TestDemo(t *testing.T) {
	t.Run("miniredis", func(t *testing.T) { checkDemo(t, "") })
	t.Run("redis", func(t *testing.T) {
		addr := redistest.Addr(t)
		checkDemo(t, addr)
		checkDemo(t, addr)
	})
}

func checkDemo(t *testing.T, addr string) {
	t.Helper()
	var out bytes.Buffer
	if err := runDemo(addr, &out); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	s := out.String()
	t.Log("\n" + s)
	rows := regexp.MustCompile(`(?m)^  (pay-\S+) +acct-\d +\S+ +(\d) +(\S+)  (\S+)$`).FindAllStringSubmatch(s, -1)
	if len(rows) != demoPayments {
		t.Fatalf("%d ledger rows, want %d", len(rows), demoPayments)
	}
	dups := 0
	for _, r := range rows {
		if r[3] != "1" {
			t.Errorf("%s credited %s times, want 1", r[1], r[3])
		}
		if r[2] == "2" {
			dups++
		}
	}
	if dups != 2 {
		t.Errorf("%d payments sent twice, want 2", dups)
	}
	for _, want := range []string{
		"every payment credited exactly once; all 10 entries acked, none pending",
		// alice's last credit, claimed and replayed by bob or carol:
		"outcome=applied by=alice",
		"via=claim outcome=replayed by=alice",
		"XPENDING: 3 entries pending with her",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("the demo's output lacks %q", want)
		}
	}
}

// TestRestartReadsOwnPending: a consumer that stopped (at a hold point,
// without XACK) and starts again under its name reads its own pending
// entries back first (XREADGROUP ... 0): the one it credited is replayed,
// the others credited, each once.
func TestRestartReadsOwnPending(t *testing.T) {
	mr := miniredis.RunT(t)
	var (
		mu   sync.Mutex
		outs []outcome
	)
	report := func(r outcome) {
		mu.Lock()
		defer mu.Unlock()
		outs = append(outs, r)
	}
	stream := "restart"
	start := func(hold func(context.Context, string, entry) error) error {
		c := newClient(mr.Addr())
		defer c.Close()
		m, err := idem.New(redisstore.New(c), idem.WithLease(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer m.Shutdown(context.Background())
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		w := &worker{rdb: c, m: m, stream: stream, group: "g", name: "alice", minIdle: time.Hour,
			block: 10 * time.Millisecond, count: 5, report: func(r outcome) {
				report(r)
				mu.Lock()
				defer mu.Unlock()
				if len(outs) == 11 { // 2 before the stop, 4 pending read back, 5 new
					cancel()
				}
			}, hold: hold}
		return w.run(ctx)
	}
	rdb := newClient(mr.Addr())
	defer rdb.Close()
	if _, err := produce(context.Background(), rdb, stream, "p", 10, func(int) bool { return false }); err != nil {
		t.Fatal(err)
	}
	dos := 0
	if err := start(func(_ context.Context, point string, _ entry) error {
		if point == pointAfterDo {
			if dos++; dos == 2 {
				return errStop
			}
		}
		return nil
	}); err != errStop {
		t.Fatalf("first run: %v, want errStop", err)
	}
	if err := start(nil); err != context.Canceled {
		t.Fatalf("second run: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	var got []string
	for _, r := range outs {
		got = append(got, fmt.Sprintf("%s %s %s %t", r.e.payment, r.e.via, r.what, r.acked))
	}
	want := []string{
		"p-00001 read applied true", "p-00002 read applied false", // the stop
		"p-00002 history replayed true", "p-00003 history applied true", "p-00004 history applied true", "p-00005 history applied true",
		"p-00006 read applied true", "p-00007 read applied true", "p-00008 read applied true",
		"p-00009 read applied true", "p-00010 read applied true",
	}
	if strings.Join(got, "\n") != strings.Join(want[:len(got)], "\n") || len(got) != 11 {
		t.Errorf("outcomes:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	applied, err := mr.HKeys(ledgerOf(stream).applied)
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) != 10 {
		t.Errorf("%d payments credited, want 10", len(applied))
	}
	for _, p := range applied {
		if n := mr.HGet(ledgerOf(stream).applied, p); n != "1" {
			t.Errorf("%s credited %s times", p, n)
		}
	}
}

// build is the consumer binary, built once per test binary.
var build struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

// consumerBinary builds this command (without -race, so that it builds
// and runs quickly) and returns its path.
func consumerBinary(t testing.TB) string {
	t.Helper()
	build.once.Do(func() {
		goBin, err := exec.LookPath("go")
		if err != nil {
			build.err = fmt.Errorf("the go command, to build the program: %w", err)
			return
		}
		if build.dir, build.err = os.MkdirTemp("", "idem-consumer-*"); build.err != nil {
			return
		}
		build.bin = filepath.Join(build.dir, "consumer")
		cmd := exec.Command(goBin, "build", "-o", build.bin, "github.com/idemkit/idem/examples/consumer")
		cmd.Env = append(os.Environ(), "GOFLAGS=")
		if out, err := cmd.CombinedOutput(); err != nil {
			build.err = fmt.Errorf("go build examples/consumer: %w\n%s", err, out)
		}
	})
	if build.err != nil {
		t.Fatal(build.err)
	}
	return build.bin
}

// newTestClient is a client for the test's own checks, with go-redis's
// default timeouts.
func newTestClient(addr string) *redis.Client { return redis.NewClient(&redis.Options{Addr: addr}) }
