package sqlstore

import (
	"context"
	"database/sql"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/storage"
)

// Lookup implements [storage.Inspector.Lookup]: one plain SELECT, which
// locks nothing and waits for nothing (it reads a row that a Fence's
// transaction holds as it was before). A committed entry's LeaseLeft is
// that of the execution that committed it (0 once it has ended). Errors
// wrap [storage.ErrNotFound], or say that the database could not be
// reached or failed.
func (s *Store) Lookup(ctx context.Context, key string, withRecord bool) (storage.Entry, error) {
	var e entryRow
	flag := 0
	if withRecord {
		flag = 1
	}
	found, err := s.queryRow(ctx, s.sql.lookup, []any{flag, []byte(key)}, append(e.dest(), &e.record)...)
	switch {
	case err != nil:
		return storage.Entry{}, fmt.Errorf("sqlstore: lookup: %w", err)
	case !found:
		return storage.Entry{}, fmt.Errorf("sqlstore: lookup: %w", storage.ErrNotFound)
	}
	v, err := e.entry(withRecord)
	if err != nil {
		return storage.Entry{}, fmt.Errorf("sqlstore: lookup: %w", err)
	}
	return v, nil
}

// Remove implements [storage.Inspector.Remove]: a locking read with
// NOWAIT, then a DELETE that compares the version again, so the check and
// the deletion are one step (the row stays locked between them only for
// the DELETE's own statement; a row changed in between is not deleted,
// and Remove reads it again). It does not wait for a transaction that
// holds the row: while one that fenced the entry is open, it answers an
// error wrapping [ErrLocked] at once, having changed nothing; try again.
// Errors wrap [storage.ErrNotFound], [storage.ErrChanged] (with the entry
// as it is), [storage.ErrInvalid] or [ErrLocked], or say that the
// database could not be reached or failed.
func (s *Store) Remove(ctx context.Context, key, version string) (storage.Entry, error) {
	if version == "" {
		return storage.Entry{}, fmt.Errorf("sqlstore: remove: %w: no version", storage.ErrInvalid)
	}
	for try := 0; ; try++ {
		var e entryRow
		found, err := s.queryRow(ctx, s.sql.removeProbe, []any{[]byte(key)}, e.dest()...)
		switch {
		case err != nil && s.dialect.classify(err) == errLocked:
			return storage.Entry{}, fmt.Errorf("sqlstore: remove: %w", ErrLocked)
		case err != nil:
			return storage.Entry{}, fmt.Errorf("sqlstore: remove: %w", err)
		case !found:
			return storage.Entry{}, fmt.Errorf("sqlstore: remove: %w", storage.ErrNotFound)
		}
		v, err := e.entry(false)
		if err != nil {
			return storage.Entry{}, fmt.Errorf("sqlstore: remove: %w", err)
		}
		if v.Version != version {
			return v, fmt.Errorf("sqlstore: remove: %w: it is %v now", storage.ErrChanged, v.State)
		}
		n, err := s.exec(ctx, s.sql.remove, []byte(key), version)
		if err != nil {
			return storage.Entry{}, fmt.Errorf("sqlstore: remove: %w", err)
		}
		if n == 1 {
			return v, nil
		}
		if try == 3 {
			return storage.Entry{}, fmt.Errorf("sqlstore: remove: %w", ErrLocked)
		}
		// Changed or gone between the read and the DELETE: read it again.
	}
}

// List implements [storage.Inspector.List]: one plain SELECT, which locks
// nothing, and reads at most q.Limit rows. With a State, the entries come
// oldest Since first, through the index on (state, since, key), and
// MinAge is a range of that index; without a State, in the order of
// their keys, through the primary key, and MinAge filters the rows read.
// Expired rows that the janitor has not deleted yet are read and left
// out, so a page may hold fewer than q.Limit entries. Errors wrap
// [storage.ErrInvalid], or say that the database could not be reached or
// failed.
func (s *Store) List(ctx context.Context, q storage.Query) (storage.Page, error) {
	q, err := storage.CheckQuery(q)
	if err != nil {
		return storage.Page{}, fmt.Errorf("sqlstore: list: %w", err)
	}
	cur, err := parseCursor(q.Cursor, q.State != 0)
	if err != nil {
		return storage.Page{}, fmt.Errorf("sqlstore: list: %w", err)
	}
	var (
		query string
		args  []any
	)
	if q.State == 0 {
		query, args = s.sql.listAll, []any{cur.key, q.Limit}
	} else {
		var minAge int64
		if q.MinAge > 0 {
			minAge = q.MinAge.Microseconds()
		}
		query, args = s.sql.listState, []any{stateName(q.State), minAge, minAge, cur.since, cur.since, cur.key, q.Limit}
	}
	st, err := s.stmt(ctx, query)
	if err != nil {
		return storage.Page{}, fmt.Errorf("sqlstore: list: %w", err)
	}
	rows, err := st.QueryContext(ctx, args...)
	if err != nil {
		return storage.Page{}, fmt.Errorf("sqlstore: list: %w", err)
	}
	defer rows.Close()
	var read []entryRow
	for rows.Next() {
		var e entryRow
		if err := rows.Scan(e.dest()...); err != nil {
			return storage.Page{}, fmt.Errorf("sqlstore: list: %w", err)
		}
		read = append(read, e)
	}
	if err := rows.Err(); err != nil {
		return storage.Page{}, fmt.Errorf("sqlstore: list: %w", err)
	}
	var page storage.Page
	for _, row := range read {
		if row.expires <= row.now {
			continue // expired: absent
		}
		e, err := row.entry(false)
		if err != nil {
			return storage.Page{}, fmt.Errorf("sqlstore: list: %w", err)
		}
		if q.MinAge > 0 && time.UnixMicro(row.now).Sub(e.Since) < q.MinAge {
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

// listCursor is where a listing goes on: after the row of this since (µs)
// and key, in the order of List. Its text is the key in hex, after, for a
// listing of a state, the since and a colon.
type listCursor struct {
	since int64
	key   []byte
}

func (c listCursor) String(withSince bool) string {
	k := hex.EncodeToString(c.key)
	if !withSince {
		return k
	}
	return strconv.FormatInt(c.since, 10) + ":" + k
}

// parseCursor reads a Page.Next that List made; "" is the start.
func parseCursor(s string, withSince bool) (listCursor, error) {
	c := listCursor{key: []byte{}, since: -1 << 62}
	if s == "" {
		return c, nil
	}
	k, ok := s, true
	if withSince {
		var since string
		since, k, ok = strings.Cut(s, ":")
		if ok {
			us, err := strconv.ParseInt(since, 10, 64)
			c.since, ok = us, err == nil
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

// entryRow is a row of the inspection columns, and the record when asked.
type entryRow struct {
	key, fingerprint    []byte
	state               string
	since, expires, now int64 // µs since the Unix epoch
	heldUntil           sql.NullInt64
	size                int64
	version             string
	record              []byte
}

func (e *entryRow) dest() []any {
	return []any{&e.key, &e.state, &e.fingerprint, &e.since, &e.expires, &e.heldUntil, &e.size, &e.now, &e.version}
}

func (e *entryRow) entry(withRecord bool) (storage.Entry, error) {
	v := storage.Entry{Key: string(e.key), Fingerprint: string(e.fingerprint), Since: time.UnixMicro(e.since),
		Expires: time.UnixMicro(e.expires), Version: e.version}
	switch e.state {
	case "processing":
		v.State, v.LeaseLeft = storage.InFlight, max(time.Duration(e.expires-e.now)*time.Microsecond, 0)
	case "committed":
		v.State = storage.Committed
		if e.heldUntil.Valid {
			v.LeaseLeft = max(time.Duration(e.heldUntil.Int64-e.now)*time.Microsecond, 0)
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
