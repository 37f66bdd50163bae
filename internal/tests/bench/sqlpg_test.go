package bench

import (
	"context"
	"testing"

	"github.com/idemkit/idem/internal/pgtest"
	"github.com/idemkit/idem/internal/tests/pgxtest"
	"github.com/idemkit/idem/storage/sqlstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// openSQLPostgres opens sqlstore's PostgreSQL dialect with a table of the
// setup's own on the test binary's PostgreSQL (see internal/pgtest:
// skipped without one, unless IDEM_REQUIRE_PG=1), through database/sql and
// pgx's driver (stdlib.OpenDB) with database/sql's pool defaults, whose
// connections a pgxtest.Counter counts as the postgres store's are: the
// writes to their sockets, and the statements pgx runs (BEGIN and COMMIT
// included; preparing one is a round trip but no statement). The pool of
// pgxtest.Pool beside it, not counted, creates and drops the tables.
func openSQLPostgres(tb testing.TB) store {
	admin := pgxtest.Pool(tb)
	table := pgxtest.Table(tb, admin)
	cfg, err := pgx.ParseConfig(pgtest.DSN(tb))
	if err != nil {
		tb.Fatal(err)
	}
	c := new(pgxtest.Counter)
	c.ConfigureConn(cfg)
	// pgx's driver pings a connection that database/sql takes after a
	// second idle (ResetSession): never in a measurement loop, but after
	// a pause it would be a round trip counted against the request that
	// follows, as the postgres store's ShouldPing says.
	db := stdlib.OpenDB(*cfg, stdlib.OptionShouldPing(func(context.Context, stdlib.ShouldPingParams) bool { return false }))
	tb.Cleanup(func() { db.Close() }) // before the table is dropped
	s, err := sqlstore.New(db, sqlstore.PostgreSQL, sqlstore.WithTable(table))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	if err := s.CreateTable(context.Background()); err != nil {
		tb.Fatal(err)
	}
	quoted := pgx.Identifier{table}.Sanitize()
	return store{Store: s, sql: s, db: db, sqlPG: true, pgCounter: c, pool: admin, table: quoted, sqlTable: quoted}
}
