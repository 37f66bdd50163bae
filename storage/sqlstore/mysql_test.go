package sqlstore_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/mysqltest"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/sqlstore"
	"github.com/idemkit/idem/storage/storagetest"
)

// TestRecordOverMaxAllowedPacket: with the server's max_allowed_packet set
// to 64 KiB, a Complete whose record does not fit returns
// ErrRecordTooLarge, changes nothing (the entry stays the owner's, and a
// smaller record then completes it), and corrupts nothing; a record that
// fits, just under the limit, is stored and read back byte for byte.
func TestRecordOverMaxAllowedPacket(t *testing.T) {
	const limit = 64 << 10
	db := lowPacket(t, limit)
	s := open(t, db)
	ctx := context.Background()
	big := bytes.Repeat([]byte{0, 'x', 0xff, ' '}, limit/4+1)
	if res, err := s.Acquire(ctx, "k", "o1", "fp", time.Minute); err != nil || res.State != storage.Acquired {
		t.Fatal(res, err)
	}
	err := s.Complete(ctx, "k", "o1", big, time.Hour)
	if !errors.Is(err, sqlstore.ErrRecordTooLarge) || errors.Is(err, storage.ErrNotOwner) {
		t.Fatalf("Complete of %d bytes over max_allowed_packet %d: %v, want ErrRecordTooLarge", len(big), limit, err)
	}
	if st := state(t, db, "k"); st != "processing" {
		t.Fatalf("after the failed Complete: %q, want processing", st)
	}
	fits := big[:limit-2048]
	if err := s.Complete(ctx, "k", "o1", fits, time.Hour); err != nil {
		t.Fatalf("Complete of %d bytes: %v", len(fits), err)
	}
	res, err := s.Acquire(ctx, "k", "o2", "fp", time.Minute)
	if err != nil || res.State != storage.Done || !bytes.Equal(res.Record, fits) {
		t.Fatalf("replay: %v, %v, %d bytes; want done with the record", res.State, err, len(res.Record))
	}
	// The driver alone, past the store's check, on a pool of its own: the
	// server refuses the statement (1153) and closes the connection, and
	// the row is unchanged.
	raw := sameDB(t, db, nil)
	_, err = raw.Exec("UPDATE `"+sqlstore.DefaultTable+"` SET record = ? WHERE `key` = ?", big, []byte("k"))
	if err == nil {
		t.Fatal("an UPDATE over max_allowed_packet succeeded")
	}
	t.Logf("the driver's own error for an oversized statement: %v (%s)", err, sqlstore.Classify(sqlstore.MySQL, err))
	res, err = s.Acquire(ctx, "k", "o2", "fp", time.Minute)
	if err != nil || res.State != storage.Done || !bytes.Equal(res.Record, fits) {
		t.Fatalf("after the refused UPDATE: %v, %v, %d bytes; want the record unchanged", res.State, err, len(res.Record))
	}
}

// TestContractSessionSettings runs the contract suite through connections
// whose session has a lax sql_mode (no strict mode: the server would
// truncate an oversized value instead of failing) and a time zone far
// from UTC, beside a second store's connections in another zone on the
// same table: the store's statements do not depend on either.
func TestContractSessionSettings(t *testing.T) {
	db := mysqlB.db(t, nil, map[string]string{"sql_mode": "''", "time_zone": "'+09:30'"})
	var mode, zone string
	if err := db.QueryRow("SELECT @@SESSION.sql_mode, @@SESSION.time_zone").Scan(&mode, &zone); err != nil {
		t.Fatal(err)
	}
	if mode != "" || zone != "+09:30" {
		t.Fatalf("session: sql_mode %q, time_zone %q", mode, zone)
	}
	s := open(t, db)
	// A second pool on the same database, 14 hours behind.
	db2 := sameDB(t, db, map[string]string{"time_zone": "'-04:30'"})
	s2 := open(t, db2)
	ctx := context.Background()
	if res, err := s.Acquire(ctx, "tz", "o1", "fp", time.Minute); err != nil || res.State != storage.Acquired {
		t.Fatal(res, err)
	}
	res, err := s2.Acquire(ctx, "tz", "o2", "fp", time.Minute)
	if err != nil || res.State != storage.InFlight || res.LeaseLeft < 50*time.Second || res.LeaseLeft > time.Minute {
		t.Fatalf("from another time zone: %+v, %v; want in flight with about a minute left", res, err)
	}
	storagetest.Run(t, func(t *testing.T) storagetest.Harness {
		return storagetest.Harness{Store: s, Commit: commit(db, s)}
	})
}

// TestSchema: Schema's text for a name, the names refused, CreateTable
// twice, and a table in another database.
func TestSchema(t *testing.T) {
	def, err := sqlstore.Schema(sqlstore.MySQL, "")
	if err != nil || !strings.Contains(def, "CREATE TABLE IF NOT EXISTS `idem_keys`") {
		t.Fatalf("Schema default: %v\n%s", err, def)
	}
	other, err := sqlstore.Schema(sqlstore.MySQL, "app.keys")
	if err != nil || !strings.Contains(other, "CREATE TABLE IF NOT EXISTS `app`.`keys`") ||
		!strings.Contains(other, "keys_state_check") || strings.Contains(other, "idem_keys_") {
		t.Fatalf("Schema app.keys: %v\n%s", err, other)
	}
	for _, bad := range []string{"Keys", "1keys", "a-b", "a.b.c", "x`y", strings.Repeat("k", 52)} {
		if _, err := sqlstore.Schema(sqlstore.MySQL, bad); !errors.Is(err, sqlstore.ErrTableName) {
			t.Errorf("Schema(%q): %v, want ErrTableName", bad, err)
		}
		if _, err := sqlstore.New(&sql.DB{}, sqlstore.MySQL, sqlstore.WithTable(bad)); !errors.Is(err, sqlstore.ErrTableName) {
			t.Errorf("New with table %q: %v, want ErrTableName", bad, err)
		}
	}
	if _, err := sqlstore.New(nil, sqlstore.MySQL); err == nil {
		t.Error("New(nil db): no error")
	}
	if _, err := sqlstore.New(&sql.DB{}, nil); err == nil {
		t.Error("New(nil dialect): no error")
	}
	db := mysqlB.testDB(t)
	var dbName string
	if err := db.QueryRow("SELECT DATABASE()").Scan(&dbName); err != nil {
		t.Fatal(err)
	}
	s := open(t, db, sqlstore.WithTable(dbName+".keys_x"))
	if err := s.CreateTable(context.Background()); err != nil {
		t.Fatalf("CreateTable again: %v", err)
	}
	if res, err := s.Acquire(context.Background(), "k", "o", "fp", time.Minute); err != nil || res.State != storage.Acquired {
		t.Fatal(res, err)
	}
	// A row that breaks the CHECKs is refused by the server.
	if _, err := db.Exec("INSERT INTO keys_x (`key`, state, owner, fingerprint, expires, since) VALUES ('x', 'bogus', '', '', 0, 0)"); err == nil {
		t.Error("a row in state 'bogus' was accepted")
	}
}

// TestClassify: the dialect reads the server's error codes from the
// driver's errors, wrapped or not.
func TestClassify(t *testing.T) {
	for n, want := range map[uint16]string{1062: "duplicate", 1205: "locked", 3572: "locked", 1213: "deadlock", 1153: "too large", 1146: "other"} {
		err := fmt.Errorf("wrapped: %w", &mysql.MySQLError{Number: n})
		if got := sqlstore.Classify(sqlstore.MySQL, err); got != want {
			t.Errorf("error %d: %s, want %s", n, got, want)
		}
	}
	if got := sqlstore.Classify(sqlstore.MySQL, errors.New("Error 1213")); got != "other" {
		t.Errorf("a plain error: %s", got)
	}
}

// TestDeadlockRetried provokes InnoDB's classic deadlock (error 1213): a
// transaction of the application's inserts a key's row and holds it; two
// Acquire of the key wait on it (their INSERTs queue behind its lock);
// it rolls back, the two waiting INSERTs both get a shared lock, both
// want the exclusive one, and InnoDB kills one. The store runs the
// victim's statement again: both Acquire answer, one acquired, the other
// in flight, and neither sees the 1213.
func TestDeadlockRetried(t *testing.T) {
	db := mysqlB.testDB(t)
	s := open(t, db)
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.Exec("INSERT INTO `"+sqlstore.DefaultTable+"` (`key`, state, owner, fingerprint, expires, since) "+
		"VALUES (?, 'processing', 'app', '', 0, 0)", []byte("k")); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		res storage.Result
		err error
	}
	answers := make(chan answer, 2)
	for i := range 2 {
		go func() {
			res, err := s.Acquire(ctx, "k", fmt.Sprint("o", i), fmt.Sprint("fp", i), time.Minute)
			answers <- answer{res, err}
		}()
	}
	// Both INSERTs wait on the transaction's row: the server's process list
	// shows them under way. The bound is generous: on a loaded machine under
	// -race the second INSERT took more than 5 s to reach the server (seen
	// in CI); the loop ends as soon as both wait.
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting int
		if err := db.QueryRow("SELECT COUNT(*) FROM information_schema.processlist WHERE command = 'Execute' AND info LIKE 'INSERT INTO `" +
			sqlstore.DefaultTable + "`%' AND db = DATABASE()").Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting == 2 {
			break
		}
		if time.Now().After(deadline) {
			select {
			case a := <-answers:
				t.Logf("an Acquire answered: %+v, %v", a.res, a.err)
			default:
			}
			t.Fatalf("%d Acquire waiting on the application's row after 30 s, want 2", waiting)
		}
		time.Sleep(5 * time.Millisecond) // the server's lock queue: nothing to wait on but polling it
	}
	var deadlocksBefore int64
	db.QueryRow("SELECT variable_value FROM information_schema.global_status WHERE variable_name = 'INNODB_DEADLOCKS'").Scan(&deadlocksBefore)
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	won := 0
	for range 2 {
		a := <-answers
		switch {
		case a.err != nil:
			t.Errorf("Acquire: %v", a.err)
		case a.res.State == storage.Acquired:
			won++
		case a.res.State != storage.InFlight:
			t.Errorf("Acquire: %v", a.res.State)
		}
	}
	if won != 1 {
		t.Fatalf("%d acquired, want 1", won)
	}
	var deadlocks int64
	if err := db.QueryRow("SELECT variable_value FROM information_schema.global_status WHERE variable_name = 'INNODB_DEADLOCKS'").Scan(&deadlocks); err == nil {
		t.Logf("InnoDB deadlocks during the test: %d", deadlocks-deadlocksBefore)
	}
}

// lowPacket sets the server's max_allowed_packet to limit until the test
// ends and returns a pool whose connections have it.
func lowPacket(t *testing.T, limit int64) *sql.DB {
	t.Helper()
	if os.Getenv(mysqltest.EnvDSN) != "" {
		t.Skip("it sets the server's global max_allowed_packet: not on a server of " + mysqltest.EnvDSN + ", which other tests may share")
	}
	admin := mysqlB.testDB(t)
	var old int64
	if err := admin.QueryRow("SELECT @@GLOBAL.max_allowed_packet").Scan(&old); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(fmt.Sprintf("SET GLOBAL max_allowed_packet = %d", limit)); err != nil {
		t.Skipf("cannot set max_allowed_packet: %v", err)
	}
	t.Cleanup(func() { admin.Exec(fmt.Sprintf("SET GLOBAL max_allowed_packet = %d", old)) })
	db := mysqlB.testDB(t) // new connections: they take the new limit
	var got int64
	if err := db.QueryRow("SELECT @@max_allowed_packet").Scan(&got); err != nil || got != limit {
		t.Fatalf("session max_allowed_packet %d, %v", got, err)
	}
	return db
}

// TestMiddlewareRecordTooLarge: an unfenced handler answers 128 KiB
// (WithMaxResponseBody 1 MiB) to a server whose max_allowed_packet is 64
// KiB. The client gets its answer; the key stays done, not replayable:
// retries, also once the lease has run out (the server's clock an hour
// on), get 409 ErrNotReplayable and the handler ran once. Issue 36: the
// middleware retried ErrRecordTooLarge as an outage for a lease, then the
// key freed and the next retry ran the handler again.
func TestMiddlewareRecordTooLarge(t *testing.T) {
	db := lowPacket(t, 64<<10)
	s := open(t, db)
	events := make(chan idem.Event, 4) // one a request
	m, err := idem.New(s, idem.WithLease(time.Second), idem.WithMaxResponseBody(1<<20),
		idem.WithObserver(func(ev idem.Event) { events <- ev }))
	if err != nil {
		t.Fatal(err)
	}
	body := strings.Repeat("x", 128<<10)
	var runs atomic.Int64
	h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, body)
	}))
	post := func() *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/orders", nil)
		r.Header.Set("Idempotency-Key", "big")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	if w := post(); w.Code != http.StatusCreated || w.Body.Len() != len(body) {
		t.Fatalf("first: %d, %d bytes", w.Code, w.Body.Len())
	}
	if ev := <-events; ev.Outcome != idem.NotReplayable || !errors.Is(ev.Err, sqlstore.ErrRecordTooLarge) || !errors.Is(ev.Err, storage.ErrTooLarge) {
		t.Fatalf("event %v %v, want not-replayable with ErrRecordTooLarge", ev.Outcome, ev.Err)
	}
	for i := range 2 {
		if i == 1 {
			shift(t, db, time.Hour)
		}
		if w := post(); w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "ErrNotReplayable") {
			t.Fatalf("retry %d: %d %q, want 409 ErrNotReplayable", i, w.Code, w.Body)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}
