package pgstore

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/storage"
	"github.com/jackc/pgx/v5"
)

// The inspection statements answer rows of entryColumns: key, state,
// fingerprint, since, expires, held_until, the record's size, the
// database's clock, the version, and the record when asked. A plain
// SELECT locks nothing and waits for nothing: it reads a row that a
// Fence's transaction holds as it was before (processing, or committed by
// an earlier transaction).
const entryColumns = `e.key, e.state, e.fingerprint, e.since, e.expires, e.held_until,
  coalesce(octet_length(e.record), 0), clock_timestamp(), ` + versionSQL

// versionSQL is the row's storage.Entry.Version: the first 8 bytes, in
// hex, of the SHA-256 of its state, since (in microseconds) and owner,
// which change together with every transition but a renewal (Extend, or
// an Acquire resent by the owner, keep them), and which hide the owner.
const versionSQL = `encode(substr(sha256(convert_to(e.state || ':' ||
  coalesce(floor(extract(epoch FROM e.since) * 1000000)::bigint::text, '') || ':', 'UTF8') || e.owner), 1, 8), 'hex')`

// lookupSQL: $2 true for the record.
const lookupSQL = `SELECT ` + entryColumns + `, CASE WHEN $2::boolean THEN e.record END
FROM {table} e WHERE e.key = $1 AND e.expires > clock_timestamp()`

// removeSQL deletes the key's live row if its version is $2, and answers
// it, with 'removed'. Otherwise it answers the row unchanged: with
// 'locked' when the probe lk finds it locked (a Fence's transaction is
// open, or, for a few microseconds, another statement of the store holds
// it): ErrLocked; with 'changed' when its version is another:
// ErrChanged. lk locks FOR UPDATE, as DELETE would, but skips a locked
// row instead of waiting; DELETE compares the version on the row as it
// is once locked (a row changed since the statement's snapshot is
// re-read), so the comparison and the deletion are one step.
const removeSQL = `WITH lk AS (
  SELECT e.key FROM {table} e WHERE e.key = $1 FOR UPDATE SKIP LOCKED
), del AS (
  DELETE FROM {table} e WHERE e.key = $1 AND e.expires > clock_timestamp() AND EXISTS (SELECT FROM lk)
    AND ` + versionSQL + ` = $2::text
  RETURNING ` + entryColumns + `
)
SELECT *, 'removed' FROM del
UNION ALL
SELECT ` + entryColumns + `, CASE WHEN EXISTS (SELECT FROM lk) THEN 'changed' ELSE 'locked' END FROM {table} e
WHERE e.key = $1 AND e.expires > clock_timestamp() AND NOT EXISTS (SELECT FROM del)`

// listStateSQL: $1 state, $2 MinAge in ms (0: any), $3 and $4 the cursor
// (the since of the last row scanned, NULL for none, and its key), $5 the
// limit. The inner SELECT scans at most $5 rows of the state, in the
// order of the index on (state, since, key), from the cursor on, live or
// not (expired rows that the janitor has not deleted yet count too): the
// work of a call is bounded.
const listStateSQL = `SELECT ` + entryColumns + ` FROM (
  SELECT * FROM {table} e
  WHERE e.state = $1
    AND (coalesce(e.since, '-infinity'::timestamptz), e.key) > (coalesce($3::timestamptz, '-infinity'::timestamptz), $4::bytea)
    AND ($2::bigint = 0 OR e.since <= clock_timestamp() - $2::bigint * interval '1 millisecond')
  ORDER BY coalesce(e.since, '-infinity'::timestamptz), e.key LIMIT $5
) e ORDER BY coalesce(e.since, '-infinity'::timestamptz), e.key`

// listAllSQL: every state, in the order of the primary key, after $1, the
// key of the last row scanned; the inner SELECT scans at most $2 rows.
const listAllSQL = `SELECT ` + entryColumns + ` FROM (
  SELECT * FROM {table} WHERE key > $1::bytea ORDER BY key LIMIT $2
) e ORDER BY e.key`

// Lookup implements [storage.Inspector.Lookup]: one statement, which
// locks nothing. A committed entry's LeaseLeft is that of the execution
// that committed it (0 once it has ended). Since is zero for a row
// written by a version before the since column. Errors wrap
// [storage.ErrNotFound], or say that the database could not be reached or
// failed.
func (s *Store) Lookup(ctx context.Context, key string, withRecord bool) (storage.Entry, error) {
	rows, err := s.pool.Query(ctx, s.sql.lookup, bytes(key), withRecord)
	if err != nil {
		return storage.Entry{}, fmt.Errorf("pgstore: lookup: %w", err)
	}
	e, err := pgx.CollectExactlyOneRow(rows, func(r pgx.CollectableRow) (entryRow, error) {
		var e entryRow
		err := r.Scan(append(e.dest(), &e.record)...)
		return e, err
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return storage.Entry{}, fmt.Errorf("pgstore: lookup: %w", storage.ErrNotFound)
	case err != nil:
		return storage.Entry{}, fmt.Errorf("pgstore: lookup: %w", err)
	}
	return e.entry(withRecord)
}

// Remove implements [storage.Inspector.Remove]: one statement, which
// compares the version and deletes. It does not wait for a transaction
// that holds the row: while one that fenced the entry is open, it answers
// an error wrapping [ErrLocked] at once, having changed nothing; try
// again. Errors wrap [storage.ErrNotFound], [storage.ErrChanged] (with
// the entry as it is), [storage.ErrInvalid] or [ErrLocked], or say that
// the database could not be reached or failed.
func (s *Store) Remove(ctx context.Context, key, version string) (storage.Entry, error) {
	if version == "" {
		return storage.Entry{}, fmt.Errorf("pgstore: remove: %w: no version", storage.ErrInvalid)
	}
	rows, err := s.pool.Query(ctx, s.sql.remove, bytes(key), version)
	if err != nil {
		return storage.Entry{}, fmt.Errorf("pgstore: remove: %w", err)
	}
	var outcome string
	row, err := pgx.CollectExactlyOneRow(rows, func(r pgx.CollectableRow) (entryRow, error) {
		var e entryRow
		err := r.Scan(append(e.dest(), &outcome)...)
		return e, err
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return storage.Entry{}, fmt.Errorf("pgstore: remove: %w", storage.ErrNotFound)
	case err != nil:
		return storage.Entry{}, fmt.Errorf("pgstore: remove: %w", err)
	case outcome == "locked":
		return storage.Entry{}, fmt.Errorf("pgstore: remove: %w", ErrLocked)
	}
	e, err := row.entry(false)
	if err == nil && outcome == "changed" {
		err = fmt.Errorf("pgstore: remove: %w: it is %v now", storage.ErrChanged, e.State)
	}
	return e, err
}

// List implements [storage.Inspector.List]: one statement, which locks
// nothing, and reads at most q.Limit rows. With a State, the entries come
// oldest Since first (rows without one first of all), through the index
// on (state, since, key), and MinAge is a range of that index; without a
// State, in the order of their keys, through the primary key, and MinAge
// filters the rows read. Expired rows that the janitor has not deleted
// yet are read and left out, so a page may hold fewer than q.Limit
// entries. Errors wrap [storage.ErrInvalid], or say that the database
// could not be reached or failed.
func (s *Store) List(ctx context.Context, q storage.Query) (storage.Page, error) {
	q, err := storage.CheckQuery(q)
	if err != nil {
		return storage.Page{}, fmt.Errorf("pgstore: list: %w", err)
	}
	cur, err := parseCursor(q.Cursor, q.State != 0)
	if err != nil {
		return storage.Page{}, fmt.Errorf("pgstore: list: %w", err)
	}
	var rows pgx.Rows
	if q.State == 0 {
		rows, err = s.pool.Query(ctx, s.sql.listAll, cur.key, q.Limit)
	} else {
		var minAge int64
		if q.MinAge > 0 {
			minAge = ms(q.MinAge)
		}
		rows, err = s.pool.Query(ctx, s.sql.listState, stateName(q.State), minAge, cur.since, cur.key, q.Limit)
	}
	if err != nil {
		return storage.Page{}, fmt.Errorf("pgstore: list: %w", err)
	}
	read, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (entryRow, error) {
		var e entryRow
		err := r.Scan(e.dest()...)
		return e, err
	})
	if err != nil {
		return storage.Page{}, fmt.Errorf("pgstore: list: %w", err)
	}
	var page storage.Page
	for _, row := range read {
		if !row.expires.After(row.now) {
			continue // expired: absent
		}
		e, err := row.entry(false)
		if err != nil {
			return storage.Page{}, fmt.Errorf("pgstore: list: %w", err)
		}
		if q.MinAge > 0 && (e.Since.IsZero() || row.now.Sub(e.Since) < q.MinAge) {
			continue
		}
		page.Entries = append(page.Entries, e)
	}
	if len(read) == q.Limit {
		last := read[len(read)-1]
		page.Next = listCursor{since: last.since, key: last.key}.String(q.State != 0)
	}
	return page, nil
}

// listCursor is where a listing goes on: after the row of this since
// (nil: none) and key, in the order of List. Its text is the key in hex,
// after, for a listing of a state, the since in Unix microseconds (or
// "-" for none) and a colon.
type listCursor struct {
	since *time.Time
	key   []byte
}

func (c listCursor) String(withSince bool) string {
	k := hex.EncodeToString(c.key)
	if !withSince {
		return k
	}
	if c.since == nil {
		return "-:" + k
	}
	return strconv.FormatInt(c.since.UnixMicro(), 10) + ":" + k
}

// parseCursor reads a Page.Next that List made, for a listing of a state
// when withSince is set; "" is the start.
func parseCursor(s string, withSince bool) (listCursor, error) {
	c := listCursor{key: []byte{}}
	if s == "" {
		return c, nil
	}
	k, ok := s, true
	if withSince {
		var since string
		since, k, ok = strings.Cut(s, ":")
		if ok && since != "-" {
			us, err := strconv.ParseInt(since, 10, 64)
			t := time.UnixMicro(us)
			c.since, ok = &t, err == nil
		}
	}
	key, err := hex.DecodeString(k)
	if !ok || err != nil || len(key) == 0 {
		return listCursor{}, fmt.Errorf("%w: cursor %q was not made by this store", storage.ErrInvalid, s)
	}
	c.key = key
	return c, nil
}

// stateName is the state column's value for a storage.State.
func stateName(st storage.State) string {
	switch st {
	case storage.InFlight:
		return "processing"
	case storage.Done:
		return "done"
	case storage.Committed:
		return "committed"
	}
	return "issued"
}

// entryRow is a row of entryColumns, and the record when asked.
type entryRow struct {
	key, fingerprint []byte
	state            string
	since, heldUntil *time.Time
	expires, now     time.Time
	size             int64
	version          string
	record           []byte
}

// dest is what Scan fills for entryColumns.
func (e *entryRow) dest() []any {
	return []any{&e.key, &e.state, &e.fingerprint, &e.since, &e.expires, &e.heldUntil, &e.size, &e.now, &e.version}
}

// entry is what the row shows, the record included when withRecord is
// set.
func (e *entryRow) entry(withRecord bool) (storage.Entry, error) {
	v := storage.Entry{Key: string(e.key), Fingerprint: string(e.fingerprint), Expires: e.expires, Version: e.version}
	if e.since != nil {
		v.Since = *e.since
	}
	switch e.state {
	case "processing":
		v.State, v.LeaseLeft = storage.InFlight, max(e.expires.Sub(e.now), 0)
	case "committed":
		v.State = storage.Committed
		if e.heldUntil != nil {
			v.LeaseLeft = max(e.heldUntil.Sub(e.now), 0)
		}
	case "done":
		v.State, v.Size = storage.Done, int(e.size)
		if withRecord {
			v.Record = e.record
			if v.Record == nil {
				v.Record = []byte{}
			}
		}
	case "issued":
		v.State = storage.Issued
	default:
		return storage.Entry{}, fmt.Errorf("unexpected row: state %q", e.state)
	}
	return v, nil
}
