package sqlstore

import (
	"errors"
	"strconv"
	"strings"
)

// PostgreSQL is the dialect of PostgreSQL 12 and later (see "PostgreSQL"
// in the package documentation). It works with any database/sql driver
// whose errors carry the server's SQLSTATE behind a method
// SQLState() string, found with errors.As: github.com/jackc/pgx/v5/stdlib
// (*pgconn.PgError) and github.com/lib/pq (*pq.Error), both tested.
// Keys, owners, fingerprints and records are bytea; times are bigint
// microseconds by the server's statement_timestamp(); the table is
// schema_postgres.sql's, not pgstore's. Its statements, their order and
// their round trips are MySQL's (a first execution 4, a replay or a
// conflict 1, a Fence 1 in the application's transaction), where
// storage/pgstore needs 2 and 1. What differs, and PostgreSQL's traps:
// see "PostgreSQL" in the package documentation (among them: the store's
// sessions must run under READ COMMITTED, the default, and a Fence under
// REPEATABLE READ or SERIALIZABLE may fail with 40001).
var PostgreSQL Dialect = postgresDialect{}

type postgresDialect struct{}

func (postgresDialect) name() string { return "postgres" }

// PostgreSQL truncates a longer identifier (with a NOTICE only): the name
// would not be the one given.
func (postgresDialect) maxIdent() int { return 63 }

func (postgresDialect) quote(table string) string {
	parts := strings.Split(table, ".")
	for i, p := range parts {
		parts[i] = `"` + p + `"`
	}
	return strings.Join(parts, ".")
}

// create serializes CreateTable across instances: CREATE TABLE IF NOT
// EXISTS and CREATE INDEX IF NOT EXISTS are not safe when two sessions run
// them at once (one fails with a unique violation on the catalog,
// 23505). The text is one simple-protocol query, so one implicit
// transaction, and the advisory lock lasts until its end.
func (postgresDialect) create(schema, quoted string) string {
	return "SELECT pg_advisory_xact_lock(hashtext(" + quoteLiteral("github.com/idemkit/idem/storage/sqlstore "+quoted) + "));\n" + schema
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// SQLSTATEs of PostgreSQL.
const (
	pgUniqueViolation      = "23505"
	pgLockNotAvailable     = "55P03" // FOR UPDATE NOWAIT on a locked row, or lock_timeout
	pgSerializationFailure = "40001" // REPEATABLE READ or SERIALIZABLE: the row changed since the snapshot
	pgDeadlockDetected     = "40P01"
	pgProgramLimitExceeded = "54000" // a value over 1 GB
)

func (postgresDialect) classify(err error) errKind {
	var e interface{ SQLState() string }
	if !errors.As(err, &e) {
		return errOther
	}
	switch e.SQLState() {
	case pgUniqueViolation:
		return errDuplicate
	case pgLockNotAvailable:
		return errLocked
	case pgSerializationFailure, pgDeadlockDetected:
		return errDeadlock
	case pgProgramLimitExceeded:
		return errTooLarge
	}
	return errOther
}

// pgNow is the server's clock in microseconds since the Unix epoch:
// statement_timestamp(), the time the statement started, one value for
// the whole statement (clock_timestamp() changes from one call to the
// next within it; now() is the start of the transaction, which for a
// Fence may be long before it). A timestamptz is an instant: no TimeZone
// setting changes the number.
const pgNow = "(extract(epoch FROM statement_timestamp()) * 1000000)::bigint"

// pgVersion is the row's storage.Entry.Version, as mysqlVersion.
const pgVersion = "left(encode(sha256(convert_to(e.state || ':' || e.since || ':' || upper(encode(e.owner, 'hex')), 'UTF8')), 'hex'), 16)"

// pgEntry are the columns of an Inspector's row (see entryRow).
const pgEntry = "e.key, e.state, e.fingerprint, e.since, e.expires, e.held_until, " +
	"coalesce(octet_length(e.record), 0)::bigint, {now}, " + pgVersion

// pgRowCols: as mysqlRowCols.
const pgRowCols = "e.state, e.owner, e.fingerprint, e.expires - {now}, coalesce(e.held_until - {now}, 0), e.issue_ttl IS NOT NULL, "

// pgSum is the hex SHA-256 of a done row's record, NULL otherwise.
const pgSum = "CASE WHEN e.state = 'done' THEN encode(sha256(e.record), 'hex') END"

// sql returns the statements; each numeric parameter has a cast to
// bigint: without it PostgreSQL infers integer from "? * 1000" or
// "? = 0", and a TTL over 24.8 days in milliseconds, or a MinAge over 35
// minutes in microseconds, would not fit.
func (postgresDialect) sql(t string) statements {
	r := strings.NewReplacer("{table}", t, "{now}", pgNow)
	f := func(s string) string { return numbered(r.Replace(s)) }
	return statements{
		read:  f("SELECT " + pgRowCols + "e.record FROM {table} e WHERE e.key = ?"),
		probe: f("SELECT " + pgRowCols + pgSum + " FROM {table} e WHERE e.key = ? FOR UPDATE NOWAIT"),
		peek:  f("SELECT " + pgRowCols + pgSum + " FROM {table} e WHERE e.key = ?"),
		// ? key, owner, fingerprint, lease ms.
		insert: f("INSERT INTO {table} (key, state, owner, fingerprint, expires, since) " +
			"VALUES (?, 'processing', ?, ?, {now} + ?::bigint * 1000, {now})"),
		// ? owner, owner, owner, fingerprint, lease ms, key, owner. Every
		// assignment sees the old row (PostgreSQL's UPDATE).
		take: f("UPDATE {table} SET " +
			"issue_ttl = CASE WHEN expires > {now} AND (state = 'issued' OR (state = 'processing' AND owner = ?)) THEN issue_ttl END, " +
			"since = CASE WHEN expires > {now} AND state = 'processing' AND owner = ? THEN since ELSE {now} END, " +
			"held_until = NULL, record = NULL, state = 'processing', owner = ?, fingerprint = ?, " +
			"expires = {now} + ?::bigint * 1000 " +
			"WHERE key = ? AND (expires <= {now} OR state = 'issued' OR (state = 'processing' AND owner = ?))"),
		takeIssued: f("UPDATE {table} SET " +
			"issue_ttl = CASE WHEN expires > {now} AND (state = 'issued' OR (state = 'processing' AND owner = ?)) THEN issue_ttl END, " +
			"since = CASE WHEN expires > {now} AND state = 'processing' AND owner = ? THEN since ELSE {now} END, " +
			"held_until = NULL, record = NULL, state = 'processing', owner = ?, fingerprint = ?, " +
			"expires = {now} + ?::bigint * 1000 " +
			"WHERE key = ? AND expires > {now} AND (state = 'issued' OR (state = 'processing' AND owner = ?))"),
		// ? record, ttl ms, key, owner.
		complete: f("UPDATE {table} SET since = {now}, held_until = NULL, issue_ttl = NULL, record = ?, state = 'done', " +
			"expires = {now} + ?::bigint * 1000 " +
			"WHERE key = ? AND owner = ? AND state IN ('processing', 'committed') AND expires > {now}"),
		releaseDelete: f("DELETE FROM {table} WHERE key = ? AND owner = ? AND state = 'processing' " +
			"AND (issue_ttl IS NULL OR expires <= {now})"),
		releaseBack: f("UPDATE {table} SET since = {now}, expires = {now} + issue_ttl * 1000, state = 'issued', " +
			"owner = ''::bytea, fingerprint = ''::bytea " +
			"WHERE key = ? AND owner = ? AND state = 'processing' AND issue_ttl IS NOT NULL AND expires > {now}"),
		releaseUnheld: f("UPDATE {table} SET held_until = NULL " +
			"WHERE key = ? AND owner = ? AND state = 'committed' AND expires > {now}"),
		// ? lease ms, lease ms, key, owner.
		extend: f("UPDATE {table} SET " +
			"held_until = CASE WHEN state = 'committed' AND held_until > {now} THEN {now} + ?::bigint * 1000 ELSE held_until END, " +
			"expires = CASE WHEN state = 'processing' THEN {now} + ?::bigint * 1000 ELSE expires END " +
			"WHERE key = ? AND owner = ? AND state IN ('processing', 'committed') AND expires > {now}"),
		// ? key, ttl ms, ttl ms.
		issueInsert: f("INSERT INTO {table} (key, state, owner, fingerprint, expires, issue_ttl, since) " +
			"VALUES (?, 'issued', ''::bytea, ''::bytea, {now} + ?::bigint * 1000, ?::bigint, {now})"),
		// ? ttl ms, ttl ms, key.
		issueTake: f("UPDATE {table} SET state = 'issued', owner = ''::bytea, fingerprint = ''::bytea, record = NULL, held_until = NULL, " +
			"issue_ttl = ?::bigint, since = {now}, expires = {now} + ?::bigint * 1000 " +
			"WHERE key = ? AND expires <= {now}"),
		// ? ttl ms, key, owner.
		fence: f("UPDATE {table} SET held_until = CASE WHEN state = 'processing' THEN expires ELSE held_until END, " +
			"issue_ttl = NULL, state = 'committed', expires = {now} + ?::bigint * 1000 " +
			"WHERE key = ? AND owner = ? AND state IN ('processing', 'committed') AND expires > {now}"),
		// ? batch.
		cleanupSelect: f("SELECT key FROM {table} WHERE expires <= {now} ORDER BY expires LIMIT ?::bigint"),
		// ? key. NOWAIT rather than SKIP LOCKED: a skipped row would read as
		// no row, and the store tells "gone" from "locked" by the error.
		cleanupLock:   f("SELECT 1 FROM {table} WHERE key = ? FOR UPDATE NOWAIT"),
		cleanupDelete: f("DELETE FROM {table} WHERE key = ? AND expires <= {now}"),
		// ? withRecord (0 or 1), key.
		lookup:      f("SELECT " + pgEntry + ", CASE WHEN ?::int = 1 THEN e.record END FROM {table} e WHERE e.key = ? AND e.expires > {now}"),
		removeProbe: f("SELECT " + pgEntry + " FROM {table} e WHERE e.key = ? AND e.expires > {now} FOR UPDATE NOWAIT"),
		// ? key, version.
		remove: f("DELETE FROM {table} e WHERE e.key = ? AND e.expires > {now} AND " + pgVersion + " = ?::text"),
		// ? state, min age µs (0: any), min age µs, since, since, key, limit.
		listState: f("SELECT " + pgEntry + " FROM {table} e WHERE e.state = ?::text " +
			"AND (?::bigint = 0 OR e.since <= {now} - ?::bigint) AND (e.since > ?::bigint OR (e.since = ?::bigint AND e.key > ?::bytea)) " +
			"ORDER BY e.since, e.key LIMIT ?::bigint"),
		listAll: f("SELECT " + pgEntry + " FROM {table} e WHERE e.key > ?::bytea ORDER BY e.key LIMIT ?::bigint"),
	}
}

// numbered turns the ? of q into $1, $2, ... in order (the statements
// hold no ? in a literal).
func numbered(q string) string {
	var b strings.Builder
	n := 0
	for _, c := range q {
		if c == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(c)
	}
	return b.String()
}

func (postgresDialect) schema(quoted, bare string) string {
	return strings.NewReplacer(`"idem_keys"`, quoted, "idem_keys_", bare+"_").Replace(postgresSchema)
}
