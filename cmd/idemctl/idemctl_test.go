package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemadmin"
	"github.com/idemkit/idem/internal/dynamotest"
	"github.com/idemkit/idem/internal/redistest"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/redis/go-redis/v9"
)

// TestInspect: inspect shows a done entry, named by its storage key or by
// the client's key, with its response's status, type and size but not its
// body or headers, which -body adds; an entry in flight with its lease;
// Do's entry by -op, an issued key by -issued; and exits 3 for a key with
// no entry (one starting with "-" after "--").
func TestInspect(t *testing.T) {
	each(t, func(t *testing.T, store storage.Inspector, flags []string) {
		s := newShop(t, store)
		s.order("order-1")
		key := skey("order-1")
		const body = `{"order":1}`

		out, _ := mustRun(t, 0, "", append(flags, "inspect", key)...)
		byClientKey, _ := mustRun(t, 0, "", append(flags, "inspect", "-scope", scope, "-method", "POST", "-route", route, "order-1")...)
		for _, out := range []string{out, byClientKey} {
			for name, want := range map[string]string{
				"key": key, "state": "done", "status": "201", "content type": "application/json",
				"body size": fmt.Sprint(len(body), " bytes"),
			} {
				if got := field(out, name); got != want {
					t.Errorf("%s: %q, want %q in:\n%s", name, got, want, out)
				}
			}
			if !strings.HasSuffix(field(out, "since"), " ago)") || field(out, "expires in") == "" || field(out, "lease left") != "" {
				t.Errorf("since, expires in, lease left of a done entry:\n%s", out)
			}
			if strings.Contains(out, body) || strings.Contains(out, "/orders/1") {
				t.Errorf("without -body, the body or a header is shown:\n%s", out)
			}
		}

		out, _ = mustRun(t, 0, "", append(flags, "inspect", "-body", key)...)
		if !strings.HasSuffix(out, "\n"+body+"\n") || !strings.Contains(out, "header") || !strings.Contains(out, "Location: /orders/1") {
			t.Errorf("with -body, want the headers and then the body:\n%s", out)
		}

		var e, full idemadmin.Entry
		out, _ = mustRun(t, 0, "", append(flags, "-json", "inspect", key)...)
		decode(t, out, &e)
		if e.Key != key || e.State != "done" || e.Response == nil || e.Response.Status != http.StatusCreated ||
			e.Response.Body != nil || e.Response.Header != nil {
			t.Errorf("-json: %+v, want the done entry with a 201, without body and headers", e)
		}
		out, _ = mustRun(t, 0, "", append(flags, "-json", "inspect", "-body", key)...)
		decode(t, out, &full)
		if r := full.Response; r == nil || string(r.Body) != body || r.Header.Get("Location") != "/orders/1" {
			t.Errorf("-json -body: %s, want the body and headers", out)
		}

		release := s.orderHeld("order-2")
		out, _ = mustRun(t, 0, "", append(flags, "inspect", "-scope", scope, "-method", "POST", "-route", route, "order-2")...)
		if field(out, "state") != "in_flight" || field(out, "lease left") == "" || field(out, "status") != "" {
			t.Errorf("an entry in flight:\n%s", out)
		}
		release()

		s.do("payments", "pay-1", "credited")
		out, _ = mustRun(t, 0, "", append(flags, "inspect", "-body", "-op", "payments", "pay-1")...)
		if field(out, "key") != idem.OperationStorageKey("", "payments", "pay-1") || field(out, "state") != "done" ||
			!strings.HasSuffix(out, "\ncredited\n") {
			t.Errorf("Do's entry:\n%s", out)
		}

		issued := s.issue()
		out, _ = mustRun(t, 0, "", append(flags, "inspect", "-issued", "-scope", scope, issued)...)
		if field(out, "key") != idem.IssuedStorageKey(scope, issued) || field(out, "state") != "issued" {
			t.Errorf("an issued key:\n%s", out)
		}

		for _, args := range [][]string{{"inspect", skey("order-3")}, {"inspect", "--", "-order-3"}} {
			out, errOut := mustRun(t, exitNotFound, "", append(flags, args...)...)
			if out != "" || !strings.Contains(errOut, "no such entry") {
				t.Errorf("idemctl %q, a key never sent: stdout %q, stderr %q", args, out, errOut)
			}
		}
	})
}

// TestLs: ls lists the entries of a state, by age, oldest first, at most
// -limit of them with a last line (or "more") when there were more.
func TestLs(t *testing.T) {
	each(t, func(t *testing.T, store storage.Inspector, flags []string) {
		s := newShop(t, store)
		for _, k := range []string{"order-1", "order-2", "order-3"} {
			s.order(k)
		}
		s.orderHeld("order-4")
		done := []string{skey("order-1"), skey("order-2"), skey("order-3")}

		out, _ := mustRun(t, 0, "", append(flags, "ls", "-in-flight", "-older-than", "0s")...)
		table, last := rows(t, out)
		if len(table) != 1 || table[0][0] != skey("order-4") || table[0][1] != "in_flight" || table[0][3] == "-" || last != "" {
			t.Errorf("ls -in-flight -older-than 0s: want the entry in flight, with its lease left:\n%s", out)
		}
		out, _ = mustRun(t, 0, "", append(flags, "ls", "-in-flight", "-older-than", "1h")...)
		if out != "no entries\n" {
			t.Errorf("ls -in-flight -older-than 1h: %q, want no entries", out)
		}
		var l listing
		out, _ = mustRun(t, 0, "", append(flags, "-json", "ls", "-in-flight", "-older-than", "1h")...)
		decode(t, out, &l)
		if l.Entries == nil || len(l.Entries) != 0 || l.More {
			t.Errorf("-json ls -in-flight -older-than 1h: %s", out)
		}

		out, _ = mustRun(t, 0, "", append(flags, "-json", "ls", "-done")...)
		decode(t, out, &l)
		var keys []string
		for i, e := range l.Entries {
			keys = append(keys, e.Key)
			if e.State != "done" || e.Since == nil || e.Response != nil || e.Size == 0 {
				t.Errorf("-json ls -done: %+v", e)
			}
			if i > 0 && e.Since.Before(*l.Entries[i-1].Since) {
				t.Errorf("-json ls -done: not oldest first: %s", out)
			}
		}
		if slices.Sort(keys); !slices.Equal(keys, slices.Sorted(slices.Values(done))) || l.More {
			t.Errorf("-json ls -done: %s, want %q and no more", out, done)
		}
		oldest := l.Entries

		// Two entries, and the cursor that goes on after them. PostgreSQL
		// and MySQL list the oldest first; Redis in SCAN order.
		out, _ = mustRun(t, 0, "", append(flags, "ls", "-done", "-limit", "2")...)
		table, last = rows(t, out)
		if len(table) != 2 || !strings.Contains(last, "ls -done -limit 2 -cursor ") {
			t.Errorf("ls -done -limit 2: want two of %q, and a line that says how to go on:\n%s", done, out)
		}
		if (t.Name() == "TestLs/postgres" || t.Name() == "TestLs/mysql") && (len(table) != 2 || table[0][0] != oldest[0].Key || table[1][0] != oldest[1].Key) {
			t.Errorf("ls -done -limit 2 on %s: want the two oldest of %q:\n%s", t.Name(), done, out)
		}
		out, _ = mustRun(t, 0, "", append(flags, "-json", "ls", "-done", "-limit", "2")...)
		decode(t, out, &l)
		if len(l.Entries) != 2 || !l.More || l.Next == "" {
			t.Errorf("-json ls -done -limit 2: %s, want two entries, more and next", out)
		}
		paged := []string{l.Entries[0].Key, l.Entries[1].Key}
		for cursor := l.Next; cursor != ""; cursor = l.Next {
			out, _ = mustRun(t, 0, "", append(flags, "-json", "ls", "-done", "-limit", "2", "-cursor", cursor)...)
			l = listing{}
			decode(t, out, &l)
			for _, e := range l.Entries {
				paged = append(paged, e.Key)
			}
			if len(paged) > 10 {
				t.Fatalf("-cursor goes on and on: %q", paged)
			}
		}
		if slices.Sort(paged); !slices.Equal(paged, slices.Sorted(slices.Values(done))) {
			t.Errorf("ls -done -limit 2, then -cursor: %q, want every done entry once: %q", paged, done)
		}
		if table, last = rows(t, mustRunOut(t, append(flags, "ls", "-done", "-all"))); len(table) != 3 || last != "" {
			t.Errorf("ls -done -all: want the three done entries and no more")
		}
		var all listing
		decode(t, mustRunOut(t, append(flags, "-json", "ls", "-all")), &all)
		if len(all.Entries) != 4 || all.More || all.Next != "" {
			t.Errorf("-json ls -all: %+v, want the four entries", all)
		}
		decode(t, mustRunOut(t, append(flags, "-json", "ls", "-all", "-in-flight", "-older-than", "1h")), &all)
		if all.Entries == nil || len(all.Entries) != 0 || all.More {
			t.Errorf("-json ls -all, no entry: %+v, want an empty listing", all)
		}
		if out := mustRunOut(t, append(flags, "ls", "-all", "-in-flight", "-older-than", "1h")); out != "no entries\n" {
			t.Errorf("ls -all, no entry: %q", out)
		}
		if _, errOut := mustRun(t, exitUsage, "", append(flags, "ls", "-done", "-cursor", "bad-cursor")...); !strings.Contains(errOut, "-cursor") {
			t.Errorf("ls -cursor of another store: %q, want a usage error", errOut)
		}

		out, _ = mustRun(t, 0, "", append(flags, "ls")...)
		if table, last = rows(t, out); len(table) != 4 || last != "" {
			t.Errorf("ls: want the four entries:\n%s", out)
		}
	})
}

// TestRm: rm removes an entry when the operator answers y, or with -yes,
// and the next request with its key runs the handler again; with another
// answer, or none, it removes nothing and exits 4; it exits 3 for a key
// with no entry.
func TestRm(t *testing.T) {
	each(t, func(t *testing.T, store storage.Inspector, flags []string) {
		s := newShop(t, store)
		s.order("order-1")
		s.order("order-2")

		for _, answer := range []string{"n\n", "", "maybe\n"} {
			out, errOut := mustRun(t, exitNotConfirmed, answer, append(flags, "rm", skey("order-1"))...)
			if out != "" || !strings.Contains(errOut, "state") || !strings.Contains(errOut, "remove it? [y/N]") || !strings.Contains(errOut, "not removed") {
				t.Errorf("rm answered %q: stdout %q, stderr %q", answer, out, errOut)
			}
		}
		if _, err := store.Lookup(context.Background(), skey("order-1"), false); err != nil {
			t.Fatalf("the entry not removed: %v", err)
		}
		if w := s.order("order-1"); w.Header().Get("Idempotent-Replayed") != "true" || s.runs.Load() != 2 {
			t.Fatalf("a retry before rm: replayed %q, %d runs; want a replay", w.Header().Get("Idempotent-Replayed"), s.runs.Load())
		}

		out, _ := mustRun(t, 0, "y\n", append(flags, "rm", skey("order-2"))...)
		if field(out, "key") != skey("order-2") || !strings.HasSuffix(out, "removed\n") {
			t.Errorf("rm answered y:\n%s", out)
		}
		if _, err := store.Lookup(context.Background(), skey("order-2"), false); !errors.Is(err, storage.ErrNotFound) {
			t.Errorf("after rm answered y: %v, want no entry", err)
		}

		var e idemadmin.Entry
		out, _ = mustRun(t, 0, "", append(flags, "-json", "rm", "-yes", "-scope", scope, "-method", "POST", "-route", route, "order-1")...)
		decode(t, out, &e)
		if e.Key != skey("order-1") || e.State != "done" {
			t.Errorf("-json rm -yes: %+v", e)
		}
		w := s.order("order-1")
		if w.Header().Get("Idempotent-Replayed") != "" || s.runs.Load() != 3 || w.Body.String() != `{"order":3}` {
			t.Errorf("the order after rm -yes: %s, replayed %q, %d runs; want the handler to run again",
				w.Body, w.Header().Get("Idempotent-Replayed"), s.runs.Load())
		}

		for _, args := range [][]string{{"rm", skey("order-9")}, {"rm", "-yes", skey("order-9")}} {
			if out, errOut := mustRun(t, exitNotFound, "y\n", append(flags, args...)...); out != "" || !strings.Contains(errOut, "no such entry") {
				t.Errorf("idemctl %q: stdout %q, stderr %q", args, out, errOut)
			}
		}
	})
}

// TestRmChanged: rm removes only the entry it showed. An operator sees
// an execution in flight and answers y, but the execution completes
// between the question and the answer: rm removes nothing, prints the
// entry as it is now, says so, and exits 5; a retry replays the stored
// response instead of running the handler again.
func TestRmChanged(t *testing.T) {
	each(t, func(t *testing.T, store storage.Inspector, flags []string) {
		s := newShop(t, store)
		release := s.orderHeld("order-1")
		stdin := &answerAfter{before: release, answer: "y\n"}
		code, out, errOut := idemctlIn(t, stdin, append(flags, "rm", skey("order-1"))...)
		if !stdin.asked {
			t.Fatalf("rm asked nothing: %d\n%s\n%s", code, out, errOut)
		}
		if code != exitChanged || field(out, "state") != "done" || field(out, "key") != skey("order-1") ||
			!strings.Contains(errOut, "not removed: the entry changed since it was shown: it is now done") ||
			!strings.Contains(errOut, "its handler may still be running") {
			t.Errorf("rm of an entry that completed before the answer: exit %d, stdout:\n%s\nstderr:\n%s\nwant exit %d, the done entry, and why", code, out, errOut, exitChanged)
		}
		if e, err := store.Lookup(context.Background(), skey("order-1"), false); err != nil || e.State != storage.Done {
			t.Fatalf("after rm: %+v, %v; want the done record kept", e, err)
		}
		if w := s.send("order-1", "?hold=1"); w.Header().Get("Idempotent-Replayed") != "true" || s.runs.Load() != 1 {
			t.Errorf("a retry: %d, replayed %q, %d runs; want the replay, the handler run once", w.Code, w.Header().Get("Idempotent-Replayed"), s.runs.Load())
		}
		var e idemadmin.Entry
		code, out, _ = idemctl(t, "", append(flags, "-json", "rm", "-yes", skey("order-1"))...)
		if decode(t, out, &e); code != 0 || e.State != "done" {
			t.Errorf("rm -yes of it as it is now: %d %s", code, out)
		}
	})
}

// TestRmInFlight: rm of an entry in flight warns that its handler may
// still run, and what a retry then does; -yes too.
func TestRmInFlight(t *testing.T) {
	each(t, func(t *testing.T, store storage.Inspector, flags []string) {
		s := newShop(t, store)
		s.orderHeld("order-1")
		for _, c := range []struct {
			stdin string
			args  []string
			code  int
		}{
			{"n\n", []string{"rm", skey("order-1")}, exitNotConfirmed},
			{"", []string{"rm", "-yes", skey("order-1")}, 0},
		} {
			_, errOut := mustRun(t, c.code, c.stdin, append(flags, c.args...)...)
			if !strings.Contains(errOut, "its handler may still be running") || !strings.Contains(errOut, "runs the handler again, even while this one still runs") {
				t.Errorf("idemctl %q: stderr %q, want the warning", c.args, errOut)
			}
		}
		if _, err := store.Lookup(context.Background(), skey("order-1"), false); !errors.Is(err, storage.ErrNotFound) {
			t.Errorf("after rm -yes: %v, want no entry", err)
		}
	})
}

// TestRmLocked: while a transaction that fenced the entry is open, rm
// (of the entry, or of the entries in flight) removes nothing, says why,
// and exits 1; on PostgreSQL and on MySQL.
func TestRmLocked(t *testing.T) {
	t.Run("postgres", func(t *testing.T) {
		pool, store, flags := openPG(t)
		rmLocked(t, store, flags, func(ctx context.Context) (func(), error) {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return nil, err
			}
			if err := store.Fence(ctx, tx); err != nil {
				tx.Rollback(ctx)
				return nil, err
			}
			return func() { tx.Commit(ctx) }, nil
		})
	})
	t.Run("mysql", func(t *testing.T) {
		db, store, flags := openMySQL(t)
		rmLocked(t, store, flags, func(ctx context.Context) (func(), error) {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return nil, err
			}
			if err := store.Fence(ctx, tx); err != nil {
				tx.Rollback()
				return nil, err
			}
			return func() { tx.Commit() }, nil
		})
	})
}

// rmLocked runs TestRmLocked on store: fence begins a transaction on the
// store's database, fences the request's entry in it, and returns what
// commits it.
func rmLocked(t *testing.T, store interface {
	storage.Store
	storage.Inspector
}, flags []string, fence func(ctx context.Context) (commit func(), err error)) {
	m, err := idem.New(store)
	if err != nil {
		t.Fatal(err)
	}
	held, hold := make(chan error, 1), make(chan struct{})
	app := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		commit, err := fence(r.Context())
		held <- err
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		<-hold
		commit()
		w.WriteHeader(http.StatusCreated)
	}))
	done := make(chan int, 1)
	go func() {
		r, _ := http.NewRequest(http.MethodPost, "/orders", strings.NewReader("{}"))
		r.Header.Set("Idempotency-Key", "order-1")
		w := httptest.NewRecorder()
		app.ServeHTTP(w, r)
		done <- w.Code
	}()
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	key := idem.StorageKey("", "POST", "/orders", "order-1")
	_, errOut := mustRun(t, exitFailed, "", append(flags, "rm", "-yes", key)...)
	if !strings.Contains(errOut, "locked by a transaction") {
		t.Errorf("rm of a fenced entry: %q", errOut)
	}
	// Of many: the fenced entry is listed as it was before the fence (in
	// flight), and kept.
	out, errOut := mustRun(t, exitFailed, "", append(flags, "rm", "-yes", "-in-flight", "-older-than", "0s")...)
	close(hold)
	if !strings.Contains(out, "locked") || !strings.Contains(out, key) || !strings.Contains(errOut, "1 entries locked by a transaction under way") {
		t.Errorf("rm -in-flight of a fenced entry: stdout %q, stderr %q", out, errOut)
	}
	if status := <-done; status != http.StatusCreated {
		t.Errorf("the fenced request: %d", status)
	}
	if e, err := store.Lookup(context.Background(), key, false); err != nil || e.State != storage.Done {
		t.Errorf("after rm of a fenced entry: %+v, %v; want it done", e, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.Shutdown(ctx); err != nil {
		t.Error(err)
	}
}

// TestStats: stats counts the entries by state, and names the oldest in
// flight.
func TestStats(t *testing.T) {
	each(t, func(t *testing.T, store storage.Inspector, flags []string) {
		s := newShop(t, store)
		s.order("order-1")
		s.do("payments", "pay-1", "credited")
		s.issue()
		s.orderHeld("order-2")

		out, _ := mustRun(t, 0, "", append(flags, "stats")...)
		for name, want := range map[string]string{"in_flight": "1", "done": "2", "committed": "0", "issued": "1"} {
			if got := field(out, name); got != want {
				t.Errorf("%s: %q, want %q in:\n%s", name, got, want, out)
			}
		}
		if !strings.HasPrefix(field(out, "oldest in flight"), skey("order-2")+", ") {
			t.Errorf("oldest in flight: want %s in:\n%s", skey("order-2"), out)
		}
		var st idemadmin.Stats
		out, _ = mustRun(t, 0, "", append(flags, "-json", "stats")...)
		decode(t, out, &st)
		if st.Entries["in_flight"] != 1 || st.Entries["done"] != 2 || st.Entries["issued"] != 1 ||
			st.OldestInFlight == nil || st.OldestInFlight.Key != skey("order-2") {
			t.Errorf("-json stats: %s", out)
		}
	})
}

// TestCluster: on a Redis Cluster, ls and stats find the entries of every
// master, and inspect finds an entry wherever it is.
func TestCluster(t *testing.T) {
	addrs := redistest.ClusterAddrs(t)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { rdb.Close() })
	prefix := "idemctl-test:" + rand.Text()[:10] + ":"
	s := newShop(t, redisstore.New(rdb, redisstore.WithPrefix(prefix)))
	var want []string
	for i := range 48 {
		key := fmt.Sprint("job-", i)
		s.do("jobs", key, "ran")
		want = append(want, idem.OperationStorageKey("", "jobs", key))
	}
	slices.Sort(want)
	// 48 keys of random slots: every master holds some, but once in about
	// 10^8 runs.
	for _, addr := range addrs {
		node := redis.NewClient(&redis.Options{Addr: addr})
		keys, _, err := node.Scan(context.Background(), 0, prefix+"*", 1000).Result()
		node.Close()
		if err != nil || len(keys) == 0 {
			t.Fatalf("master %s holds %d entries (%v): the test needs some on every master", addr, len(keys), err)
		}
	}
	flags := []string{"-redis-cluster", strings.Join(addrs, ","), "-prefix", prefix}

	var l listing
	out, _ := mustRun(t, 0, "", append(flags, "-json", "ls", "-limit", "1000")...)
	decode(t, out, &l)
	var got []string
	for _, e := range l.Entries {
		got = append(got, e.Key)
	}
	if slices.Sort(got); !slices.Equal(got, want) || l.More {
		t.Errorf("ls on the cluster: %d entries %q, want the %d of every master", len(got), got, len(want))
	}
	var st idemadmin.Stats
	out, _ = mustRun(t, 0, "", append(flags, "-json", "stats")...)
	decode(t, out, &st)
	if st.Entries["done"] != len(want) {
		t.Errorf("stats on the cluster: %s, want %d done", out, len(want))
	}
	for _, key := range []string{"job-0", "job-47"} {
		if out, _ := mustRun(t, 0, "", append(flags, "inspect", "-body", "-op", "jobs", key)...); field(out, "state") != "done" || !strings.HasSuffix(out, "\nran\n") {
			t.Errorf("inspect %s on the cluster:\n%s", key, out)
		}
	}
}

// TestUsage: bad flags, no store or two, an unknown command, no KEY or a
// bad one exit 2 and say why, without printing a DSN or a password; -h
// prints the help and exits 0.
func TestUsage(t *testing.T) {
	t.Setenv(envRedisAddr, "")
	t.Setenv(envRedisCluster, "")
	t.Setenv(envPGDSN, "")
	t.Setenv(envMySQLDSN, "")
	t.Setenv(envDynamoDB, "")
	const pg = "postgres://u:s3cr3tpw@localhost/db"
	const my = "u:s3cr3tpw@tcp(localhost:3306)/db"
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "no command"},
		{[]string{"stats"}, "no store"},
		{[]string{"-redis", "localhost:6379", "-pg", pg, "stats"}, "one store at a time"},
		{[]string{"-redis", "localhost:6379", "-redis-cluster", "localhost:7000", "stats"}, "one store at a time"},
		{[]string{"-redis", "localhost:6379", "frob"}, `unknown command "frob"`},
		{[]string{"-redis", "localhost:6379", "-nope", "stats"}, "-nope"},
		{[]string{"-redis", "localhost:6379", "-timeout", "0s", "stats"}, "-timeout"},
		{[]string{"-redis", "localhost:6379", "inspect"}, "no KEY"},
		{[]string{"-redis", "localhost:6379", "rm"}, "no KEY"},
		{[]string{"-redis", "localhost:6379", "inspect", "KEY", "-body"}, "one KEY, after the flags"},
		{[]string{"-redis", "localhost:6379", "inspect", "-method", "POST", "KEY"}, "-method and -route"},
		{[]string{"-redis", "localhost:6379", "inspect", "-op", "jobs", "-route", "/x", "KEY"}, "-op"},
		{[]string{"-redis", "localhost:6379", "rm", "-issued", "-op", "jobs", "KEY"}, "-issued"},
		{[]string{"-redis", "localhost:6379", "ls", "-done", "-issued"}, "one state at most"},
		{[]string{"-redis", "localhost:6379", "ls", "-limit", "0"}, "-limit"},
		{[]string{"-redis", "localhost:6379", "ls", "-older-than", "-1s"}, "-older-than"},
		{[]string{"-redis", "localhost:6379", "ls", "KEY"}, "no arguments"},
		{[]string{"-redis", "localhost:6379", "stats", "KEY"}, "no arguments"},
		{[]string{"-redis", "localhost:6379", "-table", "t", "stats"}, "-table is for a PostgreSQL or MySQL store"},
		{[]string{"-pg", pg, "-prefix", "p:", "stats"}, "-prefix is for a Redis store"},
		{[]string{"-pg", pg, "-table", "Bad-Name", "stats"}, "-table"},
		{[]string{"-pg", "postgres://u:s3cr3tpw@localhost:port/db", "stats"}, "-pg is not a connection string"},
		{[]string{"-redis-url", "http://u:s3cr3tpw@localhost", "stats"}, "-redis-url is not a URL"},
		{[]string{"-redis", "localhost:6379", "-mysql", my, "stats"}, "one store at a time"},
		{[]string{"-pg", pg, "-mysql", my, "stats"}, "one store at a time"},
		{[]string{"-mysql", my, "-prefix", "p:", "stats"}, "-prefix is for a Redis store; a MySQL store has a -table"},
		{[]string{"-mysql", my, "-table", "Bad-Name", "stats"}, "-table"},
		{[]string{"-mysql", "u:s3cr3tpw@tcp(localhost:3306/db", "stats"}, "-mysql is not a DSN"},
		{[]string{"-mysql", "u:s3cr3tpw@tcp(localhost:3306)/", "stats"}, "-mysql names no database"},
		{[]string{"-redis", "localhost:6379", "-dynamodb", "t_idem", "stats"}, "one store at a time"},
		{[]string{"-dynamodb", "t_idem", "-prefix", "p:", "stats"}, "-prefix is for a Redis store; a DynamoDB store's table is -dynamodb's"},
		{[]string{"-dynamodb", "t_idem", "-table", "t", "stats"}, "-table is for a PostgreSQL or MySQL store; a DynamoDB store's table is -dynamodb's"},
		{[]string{"-redis", "localhost:6379", "-region", "eu-west-1", "stats"}, "-region and -endpoint are for a DynamoDB store"},
		{[]string{"-pg", pg, "-endpoint", "http://localhost:8000", "stats"}, "-region and -endpoint are for a DynamoDB store"},
		{[]string{"-dynamodb", "t", "stats"}, `-dynamodb "t" is not a DynamoDB table`},
		{[]string{"-dynamodb", "orders idem", "stats"}, `-dynamodb "orders idem" is not a DynamoDB table`},
		{[]string{"-dynamodb", "t_idem", "-endpoint", "localhost:8000", "stats"}, `-endpoint "localhost:8000" is not the URL of a DynamoDB API`},
		{[]string{"-dynamodb", "t_idem", "-endpoint", "ftp://localhost:8000", "stats"}, `-endpoint "ftp://localhost:8000" is not the URL`},
	} {
		out, errOut := mustRun(t, exitUsage, "", c.args...)
		if out != "" || !strings.Contains(errOut, c.want) || !strings.Contains(errOut, "idemctl -h") || strings.Contains(errOut, "s3cr3tpw") {
			t.Errorf("idemctl %q: stdout %q, stderr %q; want %q", c.args, out, errOut, c.want)
		}
	}
	for _, args := range [][]string{{"-h"}, {"help"}, {"inspect", "-h"}, {"-redis", "localhost:6379", "ls", "-h"}} {
		if out, errOut := mustRun(t, 0, "", args...); out != help || errOut != "" {
			t.Errorf("idemctl %q: stdout %q, stderr %q; want the help", args, out, errOut)
		}
	}
}

// TestVersion: -version prints the version, with no store and no command;
// the linked version, GoReleaser's, wins over the module's.
func TestVersion(t *testing.T) {
	defer func(v string) { version = v }(version)
	version = "v9.8.7"
	out, errOut := mustRun(t, 0, "", "-version")
	if !strings.HasPrefix(out, "idemctl v9.8.7 go") || errOut != "" {
		t.Errorf("idemctl -version: stdout %q, stderr %q", out, errOut)
	}
}

// TestEnvironment: without a store flag, the environment names the store,
// one at most; a store flag overrides it.
func TestEnvironment(t *testing.T) {
	_, flags := openRedis(t)
	addr, prefix := flags[1], flags[3]
	t.Setenv(envRedisCluster, "")
	t.Setenv(envRedisAddr, addr)
	t.Setenv(envPGDSN, "")
	t.Setenv(envMySQLDSN, "")
	t.Setenv(envDynamoDB, "")
	if out, _ := mustRun(t, 0, "", "-prefix", prefix, "stats"); field(out, "done") != "0" {
		t.Errorf("stats on %s=%s:\n%s", envRedisAddr, addr, out)
	}
	t.Setenv(envPGDSN, "postgres://u:s3cr3tpw@localhost/db")
	if _, errOut := mustRun(t, exitUsage, "", "stats"); !strings.Contains(errOut, "set in the environment") || strings.Contains(errOut, "s3cr3tpw") {
		t.Errorf("two stores in the environment: %q", errOut)
	}
	t.Setenv(envPGDSN, "")
	t.Setenv(envMySQLDSN, "u:s3cr3tpw@tcp(localhost:3306)/db")
	if _, errOut := mustRun(t, exitUsage, "", "stats"); !strings.Contains(errOut, "-mysql ("+envMySQLDSN+")") || strings.Contains(errOut, "s3cr3tpw") {
		t.Errorf("Redis and MySQL in the environment: %q", errOut)
	}
	mustRun(t, 0, "", "-redis", addr, "-prefix", prefix, "stats")
}

// TestUnreachable: a store that cannot be reached exits 1, without
// printing a DSN or a password.
func TestUnreachable(t *testing.T) {
	noAWSEnvironment(t)
	addr := closedAddr(t)
	for _, flags := range [][]string{
		{"-redis", addr},
		{"-redis-url", "redis://:s3cr3tpw@" + addr + "/0"},
		{"-redis-cluster", addr},
		{"-pg", "postgres://u:s3cr3tpw@" + addr + "/db?sslmode=disable"},
		{"-mysql", "u:s3cr3tpw@tcp(" + addr + ")/db"},
		{"-dynamodb", "idem_keys", "-endpoint", "http://" + addr},
	} {
		for _, cmd := range [][]string{{"stats"}, {"ls"}, {"inspect", "KEY"}, {"rm", "-yes", "KEY"}} {
			args := append(slices.Clone(flags), cmd...)
			out, errOut := mustRun(t, exitFailed, "", args...)
			if out != "" || !strings.Contains(errOut, "idemctl: ") || strings.Contains(errOut, "s3cr3tpw") || strings.Contains(errOut, "idemctl -h") {
				t.Errorf("idemctl %q: stdout %q, stderr %q", args, out, errOut)
			}
		}
	}
}

// TestRmMany: rm with a state and -older-than lists the entries, with
// -dry-run only that, else asks naming the count and removes each only if
// it is still as listed: one that changed is kept, and rm exits 5.
func TestRmMany(t *testing.T) {
	each(t, func(t *testing.T, store storage.Inspector, flags []string) {
		s := newShop(t, store)
		s.order("order-1")
		release := s.orderHeld("order-2")

		out, _ := mustRun(t, 0, "", append(flags, "rm", "-in-flight", "-older-than", "0s", "-dry-run")...)
		if table, _ := rows(t, out); len(table) != 1 || table[0][0] != skey("order-2") {
			t.Errorf("rm -in-flight -older-than 0s -dry-run: want the entry in flight:\n%s", out)
		}
		if out, _ := mustRun(t, 0, "", append(flags, "rm", "-yes", "-in-flight", "-older-than", "1h")...); out != "no entries\n" {
			t.Errorf("rm -in-flight -older-than 1h: %q, want no entries", out)
		}
		if _, errOut := mustRun(t, exitNotConfirmed, "n\n", append(flags, "rm", "-in-flight", "-older-than", "0s")...); !strings.Contains(errOut, "remove this entry? [y/N]") {
			t.Errorf("rm -in-flight not confirmed: %q", errOut)
		}
		if _, err := store.Lookup(context.Background(), skey("order-2"), false); err != nil {
			t.Fatalf("after -dry-run and no: %v, want the entry kept", err)
		}

		// The execution completes before the answer: its record stays.
		stdin := &answerAfter{before: release, answer: "y\n"}
		code, out, errOut := idemctlIn(t, stdin, append(flags, "rm", "-in-flight", "-older-than", "0s")...)
		if code != exitChanged || !strings.Contains(out, "changed  "+skey("order-2")+": not removed: it is now done") ||
			!strings.Contains(out, "removed 0, changed 1, gone 0 (of 1 listed)") || !strings.Contains(errOut, "its handler may still be running") {
			t.Errorf("rm -in-flight of an entry that completed before the answer: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
		}
		if e, err := store.Lookup(context.Background(), skey("order-2"), false); err != nil || e.State != storage.Done {
			t.Fatalf("after rm: %+v, %v; want the done record kept", e, err)
		}

		s2 := newShop(t, store)
		s2.orderHeld("order-3")
		var r removals
		out, _ = mustRun(t, 0, "", append(flags, "-json", "rm", "-yes", "-in-flight", "-older-than", "0s")...)
		decode(t, out, &r)
		if len(r.Removed) != 1 || r.Removed[0].Key != skey("order-3") || len(r.Changed) != 0 || len(r.Gone) != 0 {
			t.Errorf("-json rm -yes -in-flight: %s", out)
		}
		if _, err := store.Lookup(context.Background(), skey("order-3"), false); !errors.Is(err, storage.ErrNotFound) {
			t.Errorf("after rm -yes -in-flight: %v, want no entry", err)
		}

		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"rm", "-in-flight"}, "-older-than"},
			{[]string{"rm", "-older-than", "1m"}, "one state"},
			{[]string{"rm", "-in-flight", "-done", "-older-than", "1m"}, "one state"},
			{[]string{"rm", "-in-flight", "-older-than", "1m", skey("order-1")}, "not both"},
			{[]string{"rm", "-dry-run", skey("order-1")}, "not both"},
			{[]string{"rm", "-in-flight", "-older-than", "1m", "-scope", "x"}, "key flags"},
			{[]string{"rm", "-in-flight", "-older-than", "-1m"}, "negative"},
		} {
			if _, errOut := mustRun(t, exitUsage, "", append(flags, c.args...)...); !strings.Contains(errOut, c.want) {
				t.Errorf("idemctl %q: %q, want %q", c.args, errOut, c.want)
			}
		}
	})
}

// TestClientKeys: KEY with key flags is read as the middleware reads the
// key header (idem.ParseKey): the RFC 8941 form finds the entry of the
// bare key, and a key the middleware refuses is a usage error (2), not
// "no such entry"; -op takes it as it stands, as Do does.
func TestClientKeys(t *testing.T) {
	each(t, func(t *testing.T, store storage.Inspector, flags []string) {
		s := newShop(t, store)
		s.order("order-x")
		out, _ := mustRun(t, 0, "", append(flags, "inspect", "-scope", scope, "-method", "POST", "-route", route, `"order-x"`)...)
		if field(out, "key") != skey("order-x") || field(out, "state") != "done" {
			t.Errorf(`inspect "order-x": want order-x's entry:\n%s`, out)
		}
		s.do("payments", `"q"`, "quoted")
		out, _ = mustRun(t, 0, "", append(flags, "inspect", "-op", "payments", `"q"`)...)
		if field(out, "key") != idem.OperationStorageKey("", "payments", `"q"`) {
			t.Errorf(`inspect -op payments "q": want Do's entry of "q", quotes and all:\n%s`, out)
		}
		for name, key := range map[string]string{"256 bytes": strings.Repeat("k", 256), "a control char": "order\x01", "non-ASCII": "ordér"} {
			for _, args := range [][]string{
				{"inspect", "-scope", scope, "-method", "POST", "-route", route, key},
				{"rm", "-yes", "-scope", scope, "-method", "POST", "-route", route, key},
				{"inspect", "-issued", "-scope", scope, key},
				{"inspect", "-op", "payments", key},
			} {
				if out, errOut := mustRun(t, exitUsage, "", append(flags, args...)...); out != "" || !strings.Contains(errOut, "not a key the middleware accepts") {
					t.Errorf("%s: idemctl %s: stdout %q, stderr %q", name, args[0], out, errOut)
				}
			}
		}
	})
}

// TestDashKey: a storage key that starts with "-" (one in 64) is taken as
// KEY without "--", and ls says how to name it.
func TestDashKey(t *testing.T) {
	store, flags := openRedis(t)
	s := newShop(t, store)
	var client string
	for i := 0; ; i++ {
		if client = fmt.Sprint("order-", i); strings.HasPrefix(skey(client), "-") {
			break
		}
	}
	s.order(client)
	key := skey(client)
	for _, args := range [][]string{{"inspect", key}, {"inspect", "-body", key}, {"inspect", "--", key}} {
		if out, _ := mustRun(t, 0, "", append(flags, args...)...); field(out, "key") != key {
			t.Errorf("idemctl %q:\n%s", args, out)
		}
	}
	out, _ := mustRun(t, 0, "", append(flags, "ls")...)
	if !strings.Contains(out, "idemctl inspect -- "+key+"\n") {
		t.Errorf("ls of a key starting with -: want the hint with --:\n%s", out)
	}
	if _, errOut := mustRun(t, exitUsage, "", append(flags, "inspect", "-nope", key)...); !strings.Contains(errOut, "-nope") {
		t.Errorf("an unknown flag before KEY: %q", errOut)
	}
	if out, _ := mustRun(t, 0, "", append(flags, "rm", "-yes", key)...); !strings.HasSuffix(out, "removed\n") {
		t.Errorf("rm -yes %s:\n%s", key, out)
	}
}

// TestScope: the scope comes from -scope, else from $IDEMCTL_SCOPE, or
// with -scope - from a line of standard input, which rm, reading its
// answer there, refuses.
func TestScope(t *testing.T) {
	store, flags := openRedis(t)
	s := newShop(t, store)
	s.order("order-1")
	s.order("order-2")
	t.Setenv(envScope, scope)
	byKey := append(slices.Clone(flags), "inspect", "-method", "POST", "-route", route, "order-1")
	if out, _ := mustRun(t, 0, "", byKey...); field(out, "key") != skey("order-1") {
		t.Errorf("inspect with %s:\n%s", envScope, out)
	}
	mustRun(t, exitNotFound, "", append(flags, "inspect", "-scope", "Bearer bob", "-method", "POST", "-route", route, "order-1")...)
	t.Setenv(envScope, "")
	if out, _ := mustRun(t, 0, scope+"\n", append(flags, "inspect", "-scope", "-", "-method", "POST", "-route", route, "order-1")...); field(out, "key") != skey("order-1") {
		t.Errorf("inspect -scope -:\n%s", out)
	}
	if _, errOut := mustRun(t, exitUsage, scope+"\ny\n", append(flags, "rm", "-scope", "-", "-method", "POST", "-route", route, "order-1")...); !strings.Contains(errOut, envScope) {
		t.Errorf("rm -scope - without -yes: %q, want a usage error naming %s", errOut, envScope)
	}
	if out, _ := mustRun(t, 0, scope+"\r\n", append(flags, "rm", "-yes", "-scope", "-", "-method", "POST", "-route", route, "order-2")...); field(out, "key") != skey("order-2") {
		t.Errorf("rm -yes -scope -:\n%s", out)
	}
	if _, errOut := mustRun(t, exitUsage, "", append(flags, "inspect", "-scope", "-", "-method", "POST", "-route", route, "order-1")...); !strings.Contains(errOut, "-scope -") {
		t.Errorf("inspect -scope - without input: %q", errOut)
	}
}

// TestBodyEncoding: -json inspect -body prints a JSON body as text, with
// body_encoding.
func TestBodyEncoding(t *testing.T) {
	store, flags := openRedis(t)
	s := newShop(t, store)
	s.order("order-1")
	out, _ := mustRun(t, 0, "", append(flags, "-json", "inspect", "-body", skey("order-1"))...)
	if !strings.Contains(out, `"body": "{\"order\":1}"`) || !strings.Contains(out, `"body_encoding": "text"`) {
		t.Errorf("-json inspect -body: want the body as text:\n%s", out)
	}
}

// TestDynamoDB: on DynamoDB, idemctl checks the table at open: a table
// that does not exist exits 1 with an error that names it, the region
// and the endpoint, before any look-up (not "no such entry"); the region
// is -region, else the SDK's (AWS_REGION), else us-east-1 with -endpoint;
// $IDEM_DYNAMODB_TABLE names the table when no store flag does.
func TestDynamoDB(t *testing.T) {
	store, flags := openDynamoDB(t)
	table, endpoint := flags[1], flags[3]
	s := newShop(t, store)
	s.order("order-1")

	missing := dynamotest.Table(t)
	for _, c := range []struct {
		env    string
		args   []string
		region string
	}{
		{"", []string{"-dynamodb", missing, "-endpoint", endpoint, "inspect", skey("order-1")}, "us-east-1"},
		{"", []string{"-dynamodb", missing, "-endpoint", endpoint, "-region", "eu-west-1", "rm", "-yes", skey("order-1")}, "eu-west-1"},
		{"ap-south-1", []string{"-dynamodb", missing, "-endpoint", endpoint, "ls"}, "ap-south-1"},
		{"ap-south-1", []string{"-dynamodb", missing, "-endpoint", endpoint, "-region", "eu-west-1", "stats"}, "eu-west-1"},
	} {
		t.Setenv("AWS_REGION", c.env)
		out, errOut := mustRun(t, exitFailed, "", c.args...)
		want := "idemctl: region " + c.region + " at " + endpoint + ": dynamostore: table not usable: " + missing + " does not exist"
		if out != "" || !strings.HasPrefix(errOut, want) || strings.Contains(errOut, "no such entry") {
			t.Errorf("idemctl %q, AWS_REGION=%q: stdout %q, stderr %q; want %q", c.args, c.env, out, errOut, want)
		}
	}
	t.Setenv("AWS_REGION", "")

	// The environment names the table; -endpoint still applies.
	t.Setenv(envDynamoDB, table)
	if out, _ := mustRun(t, 0, "", "-endpoint", endpoint, "inspect", skey("order-1")); field(out, "state") != "done" {
		t.Errorf("inspect with %s=%s:\n%s", envDynamoDB, table, out)
	}
	t.Setenv(envDynamoDB, "")

	// Without -endpoint, a region must be found somewhere.
	if _, errOut := mustRun(t, exitUsage, "", "-dynamodb", table, "stats"); !strings.Contains(errOut, "no AWS region: give -region, or set AWS_REGION") {
		t.Errorf("-dynamodb without a region: %q", errOut)
	}
}

// TestAWSConfig: with -endpoint, the credentials are dummy ones unless
// the environment names some, or the endpoint is AWS's own; the region is
// -region, else the environment's, else us-east-1 with an endpoint and
// none without.
func TestAWSConfig(t *testing.T) {
	noAWSEnvironment(t)
	ctx := context.Background()
	load := func(region, endpoint string) (string, aws.Credentials, error) {
		t.Helper()
		cfg, err := awsConfig(ctx, region, endpoint, awshttp.NewBuildableClient())
		if err != nil {
			t.Fatal(err)
		}
		creds, err := cfg.Credentials.Retrieve(ctx)
		return cfg.Region, creds, err
	}
	local := "http://127.0.0.1:8000"
	if region, creds, err := load("", local); region != "us-east-1" || err != nil || creds.AccessKeyID != "idem" {
		t.Errorf("an endpoint, nothing in the environment: region %q, credentials %q (%v); want us-east-1 and dummy ones", region, creds.AccessKeyID, err)
	}
	if region, _, _ := load("eu-west-1", local); region != "eu-west-1" {
		t.Errorf("-region eu-west-1 with an endpoint: region %q", region)
	}
	if region, _, _ := load("", ""); region != "" {
		t.Errorf("no endpoint, nothing in the environment: region %q, want none", region)
	}
	if _, creds, err := load("", "https://dynamodb.eu-west-1.amazonaws.com"); err == nil && creds.AccessKeyID == "idem" {
		t.Errorf("an endpoint of AWS's: dummy credentials, want the default chain's (none here)")
	}
	t.Setenv("AWS_REGION", "ap-south-1")
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDOPERATOR")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "operator-secret")
	if region, creds, err := load("", local); region != "ap-south-1" || err != nil || creds.AccessKeyID != "AKIDOPERATOR" {
		t.Errorf("an endpoint, AWS_REGION and keys in the environment: region %q, credentials %q (%v); want the environment's", region, creds.AccessKeyID, err)
	}
	if region, _, _ := load("eu-west-1", ""); region != "eu-west-1" {
		t.Errorf("-region eu-west-1 over AWS_REGION: region %q", region)
	}
}
