package sqlstore

import "strings"

// statements are the SQL of the store's operations on its table. In a
// statement, ? are the parameters, in order.
type statements struct {
	read, probe, peek, insert, take, takeIssued, complete, releaseDelete, releaseBack, releaseUnheld,
	extend, issueInsert, issueTake, fence, cleanupSelect, cleanupLock, cleanupDelete,
	lookup, removeProbe, remove, listState, listAll string
	// maxPacket reads the server's largest statement, in bytes; "" means
	// maxField.
	maxPacket string
}

// maxField is the largest record when the statements have no maxPacket:
// PostgreSQL's limit of 1 GB on one field.
const maxField = 1 << 30

// mysqlNow is the server's clock in microseconds since the Unix epoch:
// UTC_TIMESTAMP(6), which no session time zone changes, as a number
// (TIMESTAMPDIFF between two DATETIMEs converts nothing). It is constant
// within one statement.
const mysqlNow = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))"

// mysqlVersion is the row's storage.Entry.Version: the first 16 hex
// digits of the SHA-256 of its state, since and owner (in hex), which
// change together with every transition but a renewal, and hide the
// owner.
const mysqlVersion = "LEFT(SHA2(CONCAT(e.state, ':', e.since, ':', HEX(e.owner)), 256), 16)"

// mysqlEntry are the columns of an Inspector's row (see entryRow).
const mysqlEntry = "e.`key`, e.state, e.fingerprint, e.since, e.expires, e.held_until, " +
	"COALESCE(LENGTH(e.record), 0), {now}, " + mysqlVersion

// mysqlRowCols are the columns that Acquire, Complete, Release and Extend
// read: state, owner, fingerprint, what is left of the expiry and of the
// committed entry's lease (µs; <= 0: over), whether it came from an issue,
// and a last column (the record, or the SHA-256 of a done row's record).
const mysqlRowCols = "e.state, e.owner, e.fingerprint, e.expires - {now}, COALESCE(e.held_until - {now}, 0), e.issue_ttl IS NOT NULL, "

func (mysqlDialect) sql(t string) statements {
	r := strings.NewReplacer("{table}", t, "{now}", mysqlNow)
	f := func(s string) string { return r.Replace(s) }
	return statements{
		// One row, read without a lock: Acquire's first look (with the record
		// of a done row: a replay costs this one statement).
		read: f("SELECT " + mysqlRowCols + "e.record FROM {table} e WHERE e.`key` = ?"),
		// The same, locking the row, or failing at once when it is locked
		// (1205 on MariaDB, 3572 on MySQL); with the record's hash.
		probe: f("SELECT " + mysqlRowCols + "CASE WHEN e.state = 'done' THEN SHA2(e.record, 256) END " +
			"FROM {table} e WHERE e.`key` = ? FOR UPDATE NOWAIT"),
		// The same as probe, without a lock.
		peek: f("SELECT " + mysqlRowCols + "CASE WHEN e.state = 'done' THEN SHA2(e.record, 256) END " +
			"FROM {table} e WHERE e.`key` = ?"),
		// ? key, owner, fingerprint, lease ms.
		insert: f("INSERT INTO {table} (`key`, state, owner, fingerprint, expires, since) " +
			"VALUES (?, 'processing', ?, ?, {now} + ? * 1000, {now})"),
		// ? owner, owner, owner, fingerprint, lease ms, key, owner. The
		// assignments run left to right, each seeing the ones before (MySQL's
		// and MariaDB's default), so those that read the old row come first.
		take: f("UPDATE {table} SET " +
			"issue_ttl = CASE WHEN expires > {now} AND (state = 'issued' OR (state = 'processing' AND owner = ?)) THEN issue_ttl END, " +
			"since = CASE WHEN expires > {now} AND state = 'processing' AND owner = ? THEN since ELSE {now} END, " +
			"held_until = NULL, record = NULL, state = 'processing', owner = ?, fingerprint = ?, " +
			"expires = {now} + ? * 1000, rev = rev + 1 " +
			"WHERE `key` = ? AND (expires <= {now} OR state = 'issued' OR (state = 'processing' AND owner = ?))"),
		takeIssued: f("UPDATE {table} SET " +
			"issue_ttl = CASE WHEN expires > {now} AND (state = 'issued' OR (state = 'processing' AND owner = ?)) THEN issue_ttl END, " +
			"since = CASE WHEN expires > {now} AND state = 'processing' AND owner = ? THEN since ELSE {now} END, " +
			"held_until = NULL, record = NULL, state = 'processing', owner = ?, fingerprint = ?, " +
			"expires = {now} + ? * 1000, rev = rev + 1 " +
			"WHERE `key` = ? AND expires > {now} AND (state = 'issued' OR (state = 'processing' AND owner = ?))"),
		// ? record, ttl ms, key, owner.
		complete: f("UPDATE {table} SET since = {now}, held_until = NULL, issue_ttl = NULL, record = ?, state = 'done', " +
			"expires = {now} + ? * 1000, rev = rev + 1 " +
			"WHERE `key` = ? AND owner = ? AND state IN ('processing', 'committed') AND expires > {now}"),
		// ? key, owner.
		releaseDelete: f("DELETE FROM {table} WHERE `key` = ? AND owner = ? AND state = 'processing' " +
			"AND (issue_ttl IS NULL OR expires <= {now})"),
		releaseBack: f("UPDATE {table} SET since = {now}, expires = {now} + issue_ttl * 1000, state = 'issued', " +
			"owner = '', fingerprint = '', rev = rev + 1 " +
			"WHERE `key` = ? AND owner = ? AND state = 'processing' AND issue_ttl IS NOT NULL AND expires > {now}"),
		releaseUnheld: f("UPDATE {table} SET held_until = NULL, rev = rev + 1 " +
			"WHERE `key` = ? AND owner = ? AND state = 'committed' AND expires > {now}"),
		// ? lease ms, lease ms, key, owner.
		extend: f("UPDATE {table} SET " +
			"held_until = CASE WHEN state = 'committed' AND held_until > {now} THEN {now} + ? * 1000 ELSE held_until END, " +
			"expires = CASE WHEN state = 'processing' THEN {now} + ? * 1000 ELSE expires END, rev = rev + 1 " +
			"WHERE `key` = ? AND owner = ? AND state IN ('processing', 'committed') AND expires > {now}"),
		// ? key, ttl ms, ttl ms.
		issueInsert: f("INSERT INTO {table} (`key`, state, owner, fingerprint, expires, issue_ttl, since) " +
			"VALUES (?, 'issued', '', '', {now} + ? * 1000, ?, {now})"),
		// ? ttl ms, ttl ms, key.
		issueTake: f("UPDATE {table} SET state = 'issued', owner = '', fingerprint = '', record = NULL, held_until = NULL, " +
			"issue_ttl = ?, since = {now}, expires = {now} + ? * 1000, rev = rev + 1 " +
			"WHERE `key` = ? AND expires <= {now}"),
		// ? ttl ms, key, owner. held_until takes the lease before expires
		// becomes the TTL's end.
		fence: f("UPDATE {table} SET held_until = CASE WHEN state = 'processing' THEN expires ELSE held_until END, " +
			"issue_ttl = NULL, state = 'committed', expires = {now} + ? * 1000, rev = rev + 1 " +
			"WHERE `key` = ? AND owner = ? AND state IN ('processing', 'committed') AND expires > {now}"),
		// ? batch: the expired keys, oldest first, read through the index on
		// expires without a lock.
		cleanupSelect: f("SELECT `key` FROM {table} WHERE expires <= {now} ORDER BY expires LIMIT ?"),
		// ? key: the row, if no other transaction holds it. Not SKIP
		// LOCKED: on MariaDB 10.11, a SKIP LOCKED read of several keys
		// through the primary key returned a row that a Fence's open
		// transaction had updated (an implicit lock), and the DELETE then
		// waited for it (found by test); NOWAIT on one key sees that lock.
		cleanupLock: f("SELECT 1 FROM {table} WHERE `key` = ? FOR UPDATE NOWAIT"),
		// ? key.
		cleanupDelete: f("DELETE FROM {table} WHERE `key` = ? AND expires <= {now}"),
		// ? withRecord (0 or 1), key.
		lookup: f("SELECT " + mysqlEntry + ", CASE WHEN ? THEN e.record END FROM {table} e WHERE e.`key` = ? AND e.expires > {now}"),
		// ? key.
		removeProbe: f("SELECT " + mysqlEntry + " FROM {table} e WHERE e.`key` = ? AND e.expires > {now} FOR UPDATE NOWAIT"),
		// ? key, version.
		remove: f("DELETE e FROM {table} e WHERE e.`key` = ? AND e.expires > {now} AND " + mysqlVersion + " = ?"),
		// ? state, min age µs (0: any), min age µs, since, since, key, limit.
		listState: f("SELECT " + mysqlEntry + " FROM {table} e WHERE e.state = ? " +
			"AND (? = 0 OR e.since <= {now} - ?) AND (e.since > ? OR (e.since = ? AND e.`key` > ?)) " +
			"ORDER BY e.since, e.`key` LIMIT ?"),
		// ? key, limit.
		listAll: f("SELECT " + mysqlEntry + " FROM {table} e WHERE e.`key` > ? ORDER BY e.`key` LIMIT ?"),
		// max_allowed_packet bounds a statement, so a record.
		maxPacket: "SELECT @@max_allowed_packet",
	}
}

// schema: see schema.sql for the text under the default name.
func (mysqlDialect) schema(quoted, bare string) string {
	return strings.NewReplacer("`idem_keys`", quoted, "idem_keys_", bare+"_").Replace(mysqlSchema)
}
