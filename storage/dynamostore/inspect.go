package dynamostore

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/idemkit/idem/storage"
)

// version is an item's storage.Entry.Version: the first 8 bytes, in hex,
// of the SHA-256 of its state, since and owner, which change together with
// every transition but a renewal, and which hide the owner.
func (it *item) version() string {
	h := sha256.New()
	h.Write([]byte(it.state + ":" + strconv.FormatInt(it.since, 10) + ":"))
	h.Write([]byte(it.owner))
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// entry is what an Inspector shows of a live item, at now (Unix ms).
func (it *item) entry(key string, now int64, withRecord bool) (storage.Entry, error) {
	e := storage.Entry{Key: key, Fingerprint: it.fingerprint, Expires: time.UnixMilli(it.expires), Version: it.version()}
	if it.since != 0 {
		e.Since = time.UnixMilli(it.since)
	}
	switch it.state {
	case stateProcessing:
		e.State = storage.InFlight
		e.LeaseLeft = time.Duration(it.expires-now) * time.Millisecond
	case stateDone:
		e.State, e.Size = storage.Done, it.size
		if withRecord {
			rec, err := it.decoded()
			if err != nil {
				return storage.Entry{}, err
			}
			e.Record, e.Size = rec, len(rec)
		}
	default:
		e.State = storage.Issued
	}
	return e, nil
}

// Lookup implements [storage.Inspector.Lookup]: one strongly consistent
// GetItem. Errors wrap [storage.ErrNotFound] or [storage.ErrCorrupt], or
// are DynamoDB's.
func (s *Store) Lookup(ctx context.Context, key string, withRecord bool) (storage.Entry, error) {
	if err := checkKey(key); err != nil {
		return storage.Entry{}, fmt.Errorf("dynamostore: lookup: %w", err)
	}
	it, err := s.read(ctx, key)
	if err != nil {
		return storage.Entry{}, fmt.Errorf("dynamostore: lookup: %w", err)
	}
	now := s.nowMs()
	if !it.live(now) {
		return storage.Entry{}, fmt.Errorf("dynamostore: lookup: %w", storage.ErrNotFound)
	}
	e, err := it.entry(key, now, withRecord)
	if err != nil {
		return storage.Entry{}, fmt.Errorf("dynamostore: lookup: %w", err)
	}
	return e, nil
}

// Remove implements [storage.Inspector.Remove]: a strongly consistent
// GetItem, then, when the version matches, a DeleteItem conditioned on the
// state, Since and owner that the version was made of (so that the
// comparison and the deletion are one step), read again if the item
// changed between the two. Errors wrap [storage.ErrNotFound],
// [storage.ErrChanged] (with the entry as it is), [storage.ErrInvalid] or
// [storage.ErrCorrupt], or are DynamoDB's.
func (s *Store) Remove(ctx context.Context, key, version string) (storage.Entry, error) {
	if version == "" {
		return storage.Entry{}, fmt.Errorf("dynamostore: remove: %w: no version", storage.ErrInvalid)
	}
	if err := checkKey(key); err != nil {
		return storage.Entry{}, fmt.Errorf("dynamostore: remove: %w", err)
	}
	for range attempts {
		it, err := s.read(ctx, key)
		if err != nil {
			return storage.Entry{}, fmt.Errorf("dynamostore: remove: %w", err)
		}
		now := s.nowMs()
		if !it.live(now) {
			return storage.Entry{}, fmt.Errorf("dynamostore: remove: %w", storage.ErrNotFound)
		}
		e, err := it.entry(key, now, false)
		if err != nil {
			return storage.Entry{}, fmt.Errorf("dynamostore: remove: %w", err)
		}
		if e.Version != version {
			return e, fmt.Errorf("dynamostore: remove: %w", storage.ErrChanged)
		}
		cond := "#st = :st AND #sn = :sn AND #ex > :now AND "
		values := map[string]types.AttributeValue{":st": sv(it.state), ":sn": nv(it.since), ":now": nv(now)}
		if it.state == stateIssued {
			cond += "attribute_not_exists(#ow)"
		} else {
			cond += "#ow = :owner"
			values[":owner"] = bv(it.owner)
		}
		_, err = s.db.DeleteItem(ctx, &dynamodb.DeleteItemInput{
			TableName:                 s.table,
			Key:                       keyOf(key),
			ConditionExpression:       aws.String(cond),
			ExpressionAttributeNames:  map[string]string{"#st": attrState, "#sn": attrSince, "#ex": attrExpires, "#ow": attrOwner},
			ExpressionAttributeValues: values,
		})
		if ccf := (*types.ConditionalCheckFailedException)(nil); errors.As(err, &ccf) {
			continue // changed since the read: read it again
		}
		if err != nil {
			return storage.Entry{}, fmt.Errorf("dynamostore: remove: %w", err)
		}
		return e, nil
	}
	return storage.Entry{}, fmt.Errorf("dynamostore: remove: the item changed under %d reads in a row", attempts)
}

// cursorPrefix starts every cursor List makes: the key of the last item
// scanned follows, in unpadded URL-safe base64.
const cursorPrefix = "d1."

// List implements [storage.Inspector.List]: one strongly consistent Scan
// of at most q.Limit items (and at most 1 MB of them, DynamoDB's own
// bound on a page) from the cursor on, in the table's order, which is
// that of the keys' hashes; the items that q selects are kept. It is an
// operator's tool, not a hot path: a listing reads the whole table, and
// pays for every item it reads, records included. Errors wrap
// [storage.ErrInvalid] or [storage.ErrCorrupt], or are DynamoDB's.
func (s *Store) List(ctx context.Context, q storage.Query) (storage.Page, error) {
	q, err := storage.CheckQuery(q)
	if err != nil {
		return storage.Page{}, fmt.Errorf("dynamostore: list: %w", err)
	}
	in := &dynamodb.ScanInput{TableName: s.table, Limit: aws.Int32(int32(q.Limit)), ConsistentRead: aws.Bool(true),
		ProjectionExpression:     aws.String("#id, #st, #ow, #fp, #sz, #ex, #sn, #it"),
		ExpressionAttributeNames: map[string]string{"#id": attrKey, "#st": attrState, "#ow": attrOwner, "#fp": attrFingerprint, "#sz": attrSize, "#ex": attrExpires, "#sn": attrSince, "#it": attrIssueTTL}}
	if q.Cursor != "" {
		after, ok := strings.CutPrefix(q.Cursor, cursorPrefix)
		key, err := base64.RawURLEncoding.DecodeString(after)
		if !ok || err != nil || checkKey(string(key)) != nil {
			return storage.Page{}, fmt.Errorf("dynamostore: list: %w: cursor %q is not one of List's", storage.ErrInvalid, q.Cursor)
		}
		in.ExclusiveStartKey = keyOf(string(key))
	}
	if q.State == storage.Committed {
		return storage.Page{}, nil // the store has no committed entries
	}
	out, err := s.db.Scan(ctx, in)
	if err != nil {
		return storage.Page{}, fmt.Errorf("dynamostore: list: %w", err)
	}
	now := s.nowMs()
	var page storage.Page
	for _, m := range out.Items {
		key, ok := str(m[attrKey])
		if !ok {
			continue
		}
		it, err := parseItem(m)
		if err != nil {
			return storage.Page{}, fmt.Errorf("dynamostore: list: %s: %w", key, err)
		}
		if !it.live(now) {
			continue
		}
		e, err := it.entry(key, now, false)
		if err != nil {
			return storage.Page{}, fmt.Errorf("dynamostore: list: %w", err)
		}
		if q.State != 0 && e.State != q.State {
			continue
		}
		if q.MinAge > 0 && (e.Since.IsZero() || time.UnixMilli(now).Sub(e.Since) < q.MinAge) {
			continue
		}
		page.Entries = append(page.Entries, e)
	}
	if key, ok := str(out.LastEvaluatedKey[attrKey]); ok {
		page.Next = cursorPrefix + base64.RawURLEncoding.EncodeToString([]byte(key))
	}
	return page, nil
}
