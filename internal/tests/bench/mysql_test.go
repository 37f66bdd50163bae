package bench

import (
	"context"
	"database/sql"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/idemkit/idem/internal/mysqltest"
	"github.com/idemkit/idem/storage/sqlstore"
)

// sqlCounter counts what the connections of a go-sql-driver/mysql pool
// write, as storage/sqlstore's TestRoundTrips does (its counter lives in
// that module's tests, which this module cannot import): the driver writes
// each command in one write and waits for its answer, so writes are round
// trips. Those whose command is COM_QUERY or COM_STMT_EXECUTE are
// statements; a COM_STMT_PREPARE is a round trip but no statement.
// Connections count from their handshake on: use each once before
// counting.
type sqlCounter struct{ writes, statements atomic.Int64 }

func (c *sqlCounter) Reset()            { c.writes.Store(0); c.statements.Store(0) }
func (c *sqlCounter) RoundTrips() int64 { return c.writes.Load() }
func (c *sqlCounter) Statements() int64 { return c.statements.Load() }

// MySQL client/server protocol: a packet is a 3-byte length and a
// sequence number, then the command's byte.
const (
	comQuery       = 0x03
	comStmtExecute = 0x17
)

type countingConn struct {
	net.Conn
	c *sqlCounter
}

func (cc *countingConn) Write(b []byte) (int, error) {
	cc.c.writes.Add(1)
	if len(b) > 4 && (b[4] == comQuery || b[4] == comStmtExecute) {
		cc.c.statements.Add(1)
	}
	return cc.Conn.Write(b)
}

// openMySQL opens sqlstore with its table on a database of the test's own
// on the test binary's MariaDB (see internal/mysqltest: skipped without
// one, unless IDEM_REQUIRE_MYSQL=1), through a pool with database/sql's
// defaults whose connections c counts.
func openMySQL(tb testing.TB) store {
	dsn := mysqltest.DSN(tb)
	admin, err := sql.Open("mysql", dsn)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { admin.Close() })
	name := mysqltest.Database(tb, func(q string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := admin.ExecContext(ctx, q)
		return err
	})
	cfg, err := mysql.ParseDSN(mysqltest.WithDatabase(dsn, name))
	if err != nil {
		tb.Fatal(err)
	}
	c := new(sqlCounter)
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		conn, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &countingConn{Conn: conn, c: c}, nil
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	db := sql.OpenDB(conn)
	tb.Cleanup(func() { db.Close() })
	s, err := sqlstore.New(db, sqlstore.MySQL)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	if err := s.CreateTable(context.Background()); err != nil {
		tb.Fatal(err)
	}
	return store{Store: s, sql: s, db: db, sqlCounter: c, sqlTable: "`" + s.Table() + "`"}
}
