//go:build unix

package e2e

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/leakcheck"
	"github.com/idemkit/idem/internal/mysqltest"
	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) {
	leakcheck.Main(cleanup{mysqltest.Wrap(pgtest.Wrap(redistest.Wrap(m)))})
}

// cleanup removes the server binary after the tests.
type cleanup struct{ m leakcheck.M }

func (c cleanup) Run() int {
	defer func() {
		if build.dir != "" {
			os.RemoveAll(build.dir)
		}
	}()
	return c.m.Run()
}

// build is the idemserver binary, built once per test binary.
var build struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

// serverBinary builds ./idemserver (without -race, so that it builds and
// runs quickly) and returns its path.
func serverBinary(t testing.TB) string {
	t.Helper()
	build.once.Do(func() {
		goBin, err := exec.LookPath("go")
		if err != nil {
			build.err = fmt.Errorf("the go command, to build the program: %w", err)
			return
		}
		if build.dir, build.err = os.MkdirTemp("", "idem-e2e-*"); build.err != nil {
			return
		}
		build.bin = filepath.Join(build.dir, "idemserver")
		cmd := exec.Command(goBin, "build", "-o", build.bin, "github.com/idemkit/idem/internal/tests/e2e/idemserver")
		cmd.Env = append(os.Environ(), "GOFLAGS=")
		if out, err := cmd.CombinedOutput(); err != nil {
			build.err = fmt.Errorf("go build idemserver: %w\n%s", err, out)
		}
	})
	if build.err != nil {
		t.Fatal(build.err)
	}
	return build.bin
}

// server is one idemserver process.
type server struct {
	cmd  *exec.Cmd
	out  string // its stdout and stderr
	url  string
	pid  int
	once sync.Once
}

// startServers starts n idemserver processes with the same flags, then
// those of IDEM_E2E_SERVER_FLAGS, and kills them when the test ends.
func startServers(t testing.TB, n int, flags ...string) []*server {
	t.Helper()
	each := make([][]string, n)
	for i := range each {
		each[i] = flags
	}
	return startEach(t, each...)
}

// startEach starts an idemserver process for each set of flags, followed
// by those of IDEM_E2E_SERVER_FLAGS, and kills them when the test ends.
func startEach(t testing.TB, flags ...[]string) []*server {
	t.Helper()
	bin := serverBinary(t)
	extra := strings.Fields(os.Getenv("IDEM_E2E_SERVER_FLAGS"))
	if len(extra) > 0 {
		t.Logf("IDEM_E2E_SERVER_FLAGS: idemserver %s", strings.Join(extra, " "))
	}
	srvs := make([]*server, len(flags))
	for i, f := range flags {
		srvs[i] = startServer(t, bin, i, append(slices.Clip(f), extra...))
	}
	return srvs
}

func startServer(t testing.TB, bin string, i int, flags []string) *server {
	t.Helper()
	out := filepath.Join(t.TempDir(), "idemserver-"+strconv.Itoa(i)+".log")
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := &server{out: out, cmd: exec.Command(bin, append([]string{"-listen", "127.0.0.1:0"}, flags...)...)}
	s.cmd.Stdout, s.cmd.Stderr = f, f
	s.cmd.SysProcAttr = sysProcAttr()
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s.pid = s.cmd.Process.Pid
	t.Cleanup(s.kill)
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, _ := os.ReadFile(out)
		if line, _, ok := strings.Cut(string(b), "\n"); ok {
			addr, found := strings.CutPrefix(line, "listening ")
			if !found {
				t.Fatalf("idemserver %d: %s", i, b)
			}
			s.url = "http://" + addr + "/orders"
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("idemserver %d not listening after 30s: %s", i, b)
		}
		time.Sleep(5 * time.Millisecond) // another process: nothing to wait on but time
	}
}

// kill kills the process with SIGKILL and waits for it; it may be called
// again.
func (s *server) kill() {
	s.once.Do(func() {
		s.cmd.Process.Kill()
		s.cmd.Wait()
	})
}

// output returns what the process printed so far.
func (s *server) output() string {
	b, _ := os.ReadFile(s.out)
	return string(b)
}

// reply is one answer the client got, or its transport error.
type reply struct {
	key        string
	rid        string // X-Request-Id: unique per request
	srv        int
	sent, recv time.Time
	status     int
	retryAfter string
	replayed   bool   // Idempotent-Replayed: true
	ctype      string // Content-Type
	exec       string // X-Exec: the execution that made the response
	body       []byte // kept for 2xx only
	problem    string // the type of an RFC 9457 problem body
	err        error
}

// notReplayableType is the problem type of idem's ErrNotReplayable.
var notReplayableType = (&idem.Error{Kind: idem.ErrNotReplayable}).Type()

// notReplayable reports whether r is idem's 409 ErrNotReplayable: the key
// completed, its response was not kept. Retrying does not change it.
func (r *reply) notReplayable() bool {
	return r.err == nil && r.status == http.StatusConflict && r.problem == notReplayableType
}

func (r *reply) String() string {
	if r.err != nil {
		return fmt.Sprintf("%s (%s) to server %d: %v", r.rid, r.key, r.srv, r.err)
	}
	return fmt.Sprintf("%s (%s) to server %d: %d replayed=%t Retry-After=%q X-Exec=%q problem=%q %q",
		r.rid, r.key, r.srv, r.status, r.replayed, r.retryAfter, r.exec, r.problem, r.body)
}

// sameResponse reports whether r carries the same response as the
// executed reply x: status, Content-Type, X-Exec and body byte for byte.
func (r *reply) sameResponse(x *reply) bool {
	return r.status == x.status && r.ctype == x.ctype && r.exec == x.exec && bytes.Equal(r.body, x.body)
}

// client sends the test's requests.
type client struct {
	hc *http.Client
}

func newClient(t testing.TB) *client {
	tr := &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &client{hc: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
}

// post sends the request of key to srv: always the same body for a key,
// so that every duplicate has the same fingerprint. hold asks the handler
// to block until the client leaves or the process dies.
func (c *client) post(ctx context.Context, srvs []*server, srv int, key, rid string, hold bool) *reply {
	r := &reply{key: key, rid: rid, srv: srv}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srvs[srv].url, strings.NewReader(`{"item":"book","key":"`+key+`"}`))
	if err != nil {
		r.err = err
		return r
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("X-Request-Id", rid)
	if hold {
		req.Header.Set("X-Hold", "1")
	}
	r.sent = time.Now()
	resp, err := c.hc.Do(req)
	if err != nil {
		r.recv, r.err = time.Now(), err
		return r
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	r.recv, r.err = time.Now(), err
	r.status = resp.StatusCode
	r.retryAfter = resp.Header.Get("Retry-After")
	r.replayed = resp.Header.Get("Idempotent-Replayed") == "true"
	r.ctype = resp.Header.Get("Content-Type")
	r.exec = resp.Header.Get("X-Exec")
	if r.status/100 == 2 {
		r.body = body
	}
	if strings.HasPrefix(r.ctype, "application/problem+json") {
		var p struct{ Type string }
		json.Unmarshal(body, &p)
		r.problem = p.Type
	}
	return r
}

// checkRetryAfter reports whether a refusal carries a Retry-After of
// whole seconds in [1, max].
func checkRetryAfter(r *reply, max time.Duration) error {
	n, err := strconv.Atoi(r.retryAfter)
	if err != nil || n < 1 || time.Duration(n)*time.Second > max.Round(time.Second)+time.Second {
		return fmt.Errorf("Retry-After %q, want whole seconds in [1, %v]: %v", r.retryAfter, max, r)
	}
	return nil
}

// loadConfig shapes a load.
type loadConfig struct {
	prefix      string        // of the keys
	dups        int           // concurrent duplicates of each key
	workers     int           // requests in flight
	backoff     time.Duration // longest pause before retrying a 409 or 503
	maxAttempts int           // per duplicate
}

// load sends keys, each as dups concurrent duplicates spread round-robin
// across the servers. A duplicate that gets 409 or 503 retries, on the
// next server, after a short pause, until it gets another answer (its
// final one) or maxAttempts or the context end. A 409 ErrNotReplayable is
// final: the key completed.
type load struct {
	cfg  loadConfig
	c    *client
	srvs []*server

	items chan item
	stop  chan struct{} // closed: send no new key
	done  chan struct{} // closed when every item is done
	wg    sync.WaitGroup

	started   atomic.Int64 // keys started
	finished  atomic.Int64 // keys whose every duplicate is done
	n409      atomic.Int64
	n503      atomic.Int64
	nExecuted atomic.Int64 // 2xx answers not replayed
	answered  atomic.Int64 // answers of any kind

	mu      sync.Mutex
	replies []*reply
	finals  map[string][]*reply // per key, the final answer of each duplicate
	left    map[string]int      // per key, duplicates not done
	keys    []string            // in the order started
}

type item struct {
	key  string
	k, d int
}

func newLoad(c *client, srvs []*server, cfg loadConfig) *load {
	return &load{cfg: cfg, c: c, srvs: srvs, items: make(chan item), stop: make(chan struct{}), done: make(chan struct{}),
		finals: map[string][]*reply{}, left: map[string]int{}}
}

// start sends up to maxKeys keys in the background until stopFeeding.
// When the test ends, the load stops and is waited for.
func (l *load) start(t testing.TB, ctx context.Context, maxKeys int) {
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(func() { cancel(); <-l.done })
	go func() {
		defer close(l.items)
		for k := range maxKeys {
			select {
			case <-l.stop:
				return
			case <-ctx.Done():
				return
			default:
			}
			key := l.cfg.prefix + strconv.Itoa(k)
			l.mu.Lock()
			l.keys = append(l.keys, key)
			l.left[key] = l.cfg.dups
			l.mu.Unlock()
			l.started.Add(1)
			for d := range l.cfg.dups {
				select {
				case l.items <- item{key: key, k: k, d: d}:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	l.wg.Add(l.cfg.workers)
	for range l.cfg.workers {
		go func() {
			defer l.wg.Done()
			for it := range l.items {
				l.dup(ctx, it)
			}
		}()
	}
	go func() { l.wg.Wait(); close(l.done) }()
}

// stopFeeding sends no new key; duplicates of keys started go on.
func (l *load) stopFeeding() { close(l.stop) }

// wait waits until every duplicate started is done, or fails the test at
// the context's end.
func (l *load) wait(t testing.TB, ctx context.Context) {
	t.Helper()
	select {
	case <-l.done:
	case <-ctx.Done():
		<-l.done // the workers see ctx too, and stop
		t.Fatalf("load not done: %v (%d of %d keys done)", ctx.Err(), l.finished.Load(), l.started.Load())
	}
}

func (l *load) dup(ctx context.Context, it item) {
	backoff := 2 * time.Millisecond
	var last *reply
	for attempt := 0; attempt < l.cfg.maxAttempts && ctx.Err() == nil; attempt++ {
		srv := (it.k + it.d + attempt) % len(l.srvs)
		r := l.c.post(ctx, l.srvs, srv, it.key, fmt.Sprintf("%s/%d/%d", it.key, it.d, attempt), false)
		l.record(r)
		last = r
		if r.err == nil && r.status != http.StatusConflict && r.status != http.StatusServiceUnavailable || r.notReplayable() {
			break
		}
		if !sleep(ctx, backoff) {
			break
		}
		backoff = min(2*backoff, l.cfg.backoff)
	}
	l.mu.Lock()
	if last != nil {
		l.finals[it.key] = append(l.finals[it.key], last)
	}
	l.left[it.key]--
	if l.left[it.key] == 0 {
		l.finished.Add(1)
	}
	l.mu.Unlock()
}

func (l *load) record(r *reply) {
	if r.err == nil {
		l.answered.Add(1)
	}
	switch {
	case r.err != nil:
	case r.status == http.StatusConflict:
		l.n409.Add(1)
	case r.status == http.StatusServiceUnavailable:
		l.n503.Add(1)
	case r.status/100 == 2:
		if !r.replayed {
			l.nExecuted.Add(1)
		}
	}
	l.mu.Lock()
	l.replies = append(l.replies, r)
	l.mu.Unlock()
}

// snapshot returns the replies so far.
func (l *load) snapshot() []*reply {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.replies)
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// waitFor polls cond until it holds, or fails the test at the context's
// end. The tests wait on other processes and on Redis's clock, which
// give nothing to block on.
func waitFor(t testing.TB, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		if !sleep(ctx, 5*time.Millisecond) {
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		}
	}
}

// execution is one run of the handler: one field of an exec:<key> hash,
// named by its id, pid-seq.
type execution struct {
	pid   int
	seq   string
	rid   string
	owner string
	at    time.Time
}

func (e execution) String() string {
	return fmt.Sprintf("{pid %d seq %s rid %s owner %.8s at %s}", e.pid, e.seq, e.rid, e.owner, e.at.Format("15:04:05.000"))
}

// id is the execution's id: its field in exec:<key>, and the X-Exec header
// of its response.
func (e execution) id() string { return strconv.Itoa(e.pid) + "-" + e.seq }

// parseExecution parses the field id of an exec:<key> hash and its value,
// the line "pid seq request-id owner unix-nanoseconds".
func parseExecution(id, line string) (execution, error) {
	f := strings.Fields(line)
	if len(f) != 5 {
		return execution{}, fmt.Errorf("exec field %s: line %q", id, line)
	}
	pid, err1 := strconv.Atoi(f[0])
	ns, err2 := strconv.ParseInt(f[4], 10, 64)
	if err1 != nil || err2 != nil {
		return execution{}, fmt.Errorf("exec field %s: line %q", id, line)
	}
	e := execution{pid: pid, seq: f[1], rid: f[2], owner: f[3], at: time.Unix(0, ns)}
	if e.id() != id {
		return execution{}, fmt.Errorf("exec field %s holds the line of %s: %q", id, e.id(), line)
	}
	return e, nil
}

// executions reads the executions of every key from the count server, in
// pipelines of 1000 keys, each key's in the order they started. An
// execution is counted once however many times its record was sent: the
// count of a key is the number of distinct execution ids in its hash.
func executions(t testing.TB, ctx context.Context, rdb *redis.Client, keys []string) map[string][]execution {
	t.Helper()
	out := make(map[string][]execution, len(keys))
	for chunk := range slices.Chunk(keys, 1000) {
		cmds := make([]*redis.MapStringStringCmd, len(chunk))
		_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, k := range chunk {
				cmds[i] = p.HGetAll(ctx, "exec:"+k)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("reading executions: %v", err)
		}
		for i, k := range chunk {
			for id, line := range cmds[i].Val() {
				e, err := parseExecution(id, line)
				if err != nil {
					t.Fatal(err)
				}
				out[k] = append(out[k], e)
			}
			sortExecutions(out[k])
		}
	}
	return out
}

// sortExecutions sorts a key's executions in the order they started.
func sortExecutions(ex []execution) {
	slices.SortFunc(ex, func(a, b execution) int {
		return cmp.Or(a.at.Compare(b.at), cmp.Compare(a.pid, b.pid), cmp.Compare(len(a.seq), len(b.seq)), strings.Compare(a.seq, b.seq))
	})
}

// countExecutions returns the number of executions of key so far.
func countExecutions(ctx context.Context, rdb *redis.Client, key string) (int64, error) {
	return rdb.HLen(ctx, "exec:"+key).Result()
}

// redisClient returns a client of the test's own for addr.
func redisClient(t testing.TB, addr string) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// unstamp returns the entry of the value v under key k without its stamp
// ('T' and the 6 bytes of the time the entry entered its state; see
// redisstore's Layout), failing the test when it has none: every entry
// this release writes is stamped.
func unstamp(t testing.TB, k string, v []byte) []byte {
	t.Helper()
	if len(v) < 8 || v[0] != 'T' {
		t.Fatalf("%s holds %q: not a stamped entry", k, v)
	}
	return v[7:]
}

// checkTTLs checks that every record key under prefix has a TTL: at most
// lease while in flight ('P'), at most ttl when done ('C'). It returns the
// number of each.
func checkTTLs(t testing.TB, ctx context.Context, rdb *redis.Client, prefix string, lease, ttl time.Duration) (inFlight, done int) {
	t.Helper()
	iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		v, err := rdb.Get(ctx, k).Result()
		if err == redis.Nil {
			continue // expired in between
		}
		if err != nil {
			t.Fatal(err)
		}
		pttl, err := rdb.PTTL(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if pttl == -2*time.Nanosecond || pttl == -2*time.Millisecond {
			continue // expired in between
		}
		v = string(unstamp(t, k, []byte(v)))
		max := ttl
		switch v[0] {
		case 'P':
			inFlight++
			max = lease
		case 'C':
			done++
		default:
			t.Errorf("%s holds %q", k, v)
		}
		if pttl <= 0 || pttl > max {
			t.Errorf("%s (%c): PTTL %v, want in (0, %v]", k, v[0], pttl, max)
		}
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return inFlight, done
}

// failures collects the first few violations of a check, and counts them
// all, so that a broken guarantee prints a readable report.
type failures struct {
	t    testing.TB
	n    int
	msgs []string
}

func (f *failures) add(format string, args ...any) {
	f.n++
	if len(f.msgs) < 15 {
		f.msgs = append(f.msgs, fmt.Sprintf(format, args...))
	}
}

func (f *failures) report(what string) {
	f.t.Helper()
	if f.n > 0 {
		f.t.Errorf("%s: %d violations; the first:\n\t%s", what, f.n, strings.Join(f.msgs, "\n\t"))
	}
}

// figure logs a figure of the run and, when IDEM_E2E_FIGURES names a
// file, appends it there.
func figure(t testing.TB, format string, args ...any) {
	t.Helper()
	line := fmt.Sprintf("%s: %s", t.Name(), fmt.Sprintf(format, args...))
	t.Log("FIGURE " + line)
	if path := os.Getenv("IDEM_E2E_FIGURES"); path != "" {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			t.Errorf("IDEM_E2E_FIGURES: %v", err)
			return
		}
		defer f.Close()
		fmt.Fprintln(f, line)
	}
}

// envInt reads a positive integer from the environment.
func envInt(t testing.TB, name string, def int) int {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive integer", name, s)
	}
	return n
}

// deadline returns a context that ends after d, or a little before the
// test binary's own deadline.
func deadline(t testing.TB, d time.Duration) context.Context {
	if tt, ok := t.(*testing.T); ok {
		if end, ok := tt.Deadline(); ok {
			d = min(d, time.Until(end)-5*time.Second)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// quantile returns the q-quantile of ds (sorted in place), 0 for none.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[int(math.Ceil(q*float64(len(ds))))-1]
}

func ms(d time.Duration) string { return d.Round(time.Millisecond).String() }
