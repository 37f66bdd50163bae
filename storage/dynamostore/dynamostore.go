package dynamostore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/idemkit/idem/storage"
)

// Client is the part of the DynamoDB API the store uses. *dynamodb.Client
// implements it; so may a wrapper of the application's (metrics, a DAX
// client that keeps the same methods).
type Client interface {
	GetItem(ctx context.Context, in *dynamodb.GetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
	PutItem(ctx context.Context, in *dynamodb.PutItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error)
	UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	DeleteItem(ctx context.Context, in *dynamodb.DeleteItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error)
	Scan(ctx context.Context, in *dynamodb.ScanInput, opts ...func(*dynamodb.Options)) (*dynamodb.ScanOutput, error)
	DescribeTable(ctx context.Context, in *dynamodb.DescribeTableInput, opts ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error)
	CreateTable(ctx context.Context, in *dynamodb.CreateTableInput, opts ...func(*dynamodb.Options)) (*dynamodb.CreateTableOutput, error)
	DescribeTimeToLive(ctx context.Context, in *dynamodb.DescribeTimeToLiveInput, opts ...func(*dynamodb.Options)) (*dynamodb.DescribeTimeToLiveOutput, error)
	UpdateTimeToLive(ctx context.Context, in *dynamodb.UpdateTimeToLiveInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateTimeToLiveOutput, error)
}

var _ Client = (*dynamodb.Client)(nil)

// DefaultTable is the table's name unless WithTable says otherwise.
const DefaultTable = "idem_keys"

// MaxItemBytes is DynamoDB's limit on the size of one item: 400 KB.
const MaxItemBytes = 400 << 10

// MaxStoredRecordBytes is the most bytes a record takes in its item, after
// compression: the item limit less 4 KiB for the key (at most
// [MaxKeyBytes]), the owner (at most [MaxOwnerBytes]), the fingerprint and
// the other attributes.
const MaxStoredRecordBytes = MaxItemBytes - 4<<10

// Limits on the arguments, within DynamoDB's 2048 bytes for a partition
// key. The middleware's keys and owners are far shorter (a hash, a random
// token).
const (
	MaxKeyBytes   = 2048
	MaxOwnerBytes = 1024
)

// DefaultMaxRecordBytes is the longest record, before compression, that
// Complete accepts unless WithMaxRecordBytes says otherwise. A record must
// also fit [MaxStoredRecordBytes] once compressed.
const DefaultMaxRecordBytes = 16 << 20

// attempts bounds the conditional writes of one call: each after another
// call changed the item between two of them.
const attempts = 8

// Store is a storage.Store on a DynamoDB table. Create it with [New]; the
// zero value is not usable. It is safe for concurrent use.
type Store struct {
	db        Client
	table     *string
	maxRecord int
	now       func() time.Time
}

var (
	_ storage.Store     = (*Store)(nil)
	_ storage.Issuer    = (*Store)(nil)
	_ storage.Inspector = (*Store)(nil)
)

// Option configures a Store.
type Option func(*config)

type config struct {
	table     string
	maxRecord int
	now       func() time.Time
}

// WithTable sets the table, [DefaultTable] by default. Give each service
// its own table: [Store.List] scans the whole table.
func WithTable(name string) Option { return func(c *config) { c.table = name } }

// WithMaxRecordBytes bounds the records Complete keeps to n bytes before
// compression, [DefaultMaxRecordBytes] by default; n <= 0 keeps the
// default. A longer record, or one that does not fit
// [MaxStoredRecordBytes] once compressed, is refused with an error
// wrapping [storage.ErrTooLarge] before anything is sent: the middleware
// then keeps the key done but not replayable (409 ErrNotReplayable, never
// a second run).
func WithMaxRecordBytes(n int) Option {
	return func(c *config) {
		if n > 0 {
			c.maxRecord = n
		}
	}
}

// New returns a Store on the table of client (see WithTable). It sends
// nothing: create the table with [Store.CreateTable] or the schema of the
// package documentation, and check it with [Store.Ping] at startup. It
// fails when client is nil or the table's name is empty.
func New(client Client, opts ...Option) (*Store, error) {
	if client == nil {
		return nil, errors.New("dynamostore: nil client")
	}
	c := config{table: DefaultTable, maxRecord: DefaultMaxRecordBytes, now: time.Now}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if c.table == "" {
		return nil, errors.New("dynamostore: empty table name")
	}
	return &Store{db: client, table: aws.String(c.table), maxRecord: c.maxRecord, now: c.now}, nil
}

// Table returns the table's name.
func (s *Store) Table() string { return *s.table }

// nowMs is the instance's clock, in Unix ms: see Clocks in the package
// documentation.
func (s *Store) nowMs() int64 { return s.now().UnixMilli() }

func checkKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty key", storage.ErrInvalid)
	case len(key) > MaxKeyBytes:
		return fmt.Errorf("%w: key of %d bytes, at most %d", storage.ErrInvalid, len(key), MaxKeyBytes)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: key is not UTF-8", storage.ErrInvalid)
	}
	return nil
}

func checkAcquire(key, owner, fingerprint string, lease time.Duration) error {
	if err := storage.CheckAcquire(key, owner, fingerprint, lease); err != nil {
		return err
	}
	if len(owner) > MaxOwnerBytes {
		return fmt.Errorf("%w: owner of %d bytes, at most %d", storage.ErrInvalid, len(owner), MaxOwnerBytes)
	}
	return checkKey(key)
}

// keyOf is the item's primary key.
func keyOf(key string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{attrKey: sv(key)}
}

// The expressions. Each names the attributes it uses through
// placeholders, and each map holds only the placeholders its expressions
// use (DynamoDB refuses one that is unused).
const (
	condFree     = "attribute_not_exists(#id) OR #ex <= :now"
	condHeld     = "#st = :processing AND #ow = :owner AND #ex > :now"
	condIssued   = "#st = :issued AND #ex > :now"
	condReleased = "#st = :processing AND #ow = :owner AND (attribute_not_exists(#it) OR #ex <= :now)"
	condReissue  = condHeld + " AND #it = :it"

	updTake      = "SET #st = :processing, #ow = :owner, #fp = :fp, #ex = :ex, #ttl = :ttl, #sn = :now"
	updExtend    = "SET #ex = :ex, #ttl = :ttl"
	updComplete  = "SET #st = :done, #rec = :rec, #sz = :sz, #ex = :ex, #ttl = :ttl, #sn = :now REMOVE #it, #recz"
	updCompleteZ = "SET #st = :done, #recz = :rec, #sz = :sz, #ex = :ex, #ttl = :ttl, #sn = :now REMOVE #it, #rec"
	updReissue   = "SET #st = :issued, #ex = :ex, #ttl = :ttl, #sn = :now REMOVE #ow, #fp"
)

var (
	namesFree     = map[string]string{"#id": attrKey, "#ex": attrExpires}
	namesHeld     = map[string]string{"#st": attrState, "#ow": attrOwner, "#ex": attrExpires, "#ttl": attrTTL}
	namesTake     = map[string]string{"#st": attrState, "#ow": attrOwner, "#fp": attrFingerprint, "#ex": attrExpires, "#ttl": attrTTL, "#sn": attrSince}
	namesComplete = map[string]string{"#st": attrState, "#ow": attrOwner, "#rec": attrRecord, "#recz": attrRecordZ, "#sz": attrSize,
		"#ex": attrExpires, "#ttl": attrTTL, "#sn": attrSince, "#it": attrIssueTTL}
	namesReleased = map[string]string{"#st": attrState, "#ow": attrOwner, "#ex": attrExpires, "#it": attrIssueTTL}
	namesReissue  = map[string]string{"#st": attrState, "#ow": attrOwner, "#fp": attrFingerprint, "#ex": attrExpires, "#ttl": attrTTL,
		"#sn": attrSince, "#it": attrIssueTTL}
)

// conflict returns the item that a conditional write found in the way:
// the one DynamoDB sent back with the ConditionalCheckFailedException
// (ReturnValuesOnConditionCheckFailure), or, from an API that sends none
// (dynalite), the one a strongly consistent read finds, a second round
// trip. ok is false when err is not a failed condition.
func (s *Store) conflict(ctx context.Context, key string, err error) (it item, ok bool, _ error) {
	var ccf *types.ConditionalCheckFailedException
	if !errors.As(err, &ccf) {
		return item{}, false, err
	}
	if len(ccf.Item) > 0 {
		it, err := parseItem(ccf.Item)
		return it, true, err
	}
	it, err = s.read(ctx, key)
	return it, true, err
}

// read is a strongly consistent GetItem of the key's item.
func (s *Store) read(ctx context.Context, key string) (item, error) {
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{TableName: s.table, Key: keyOf(key), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return item{}, err
	}
	return parseItem(out.Item)
}

// Acquire implements [storage.Store.Acquire]: one conditional PutItem for
// a key without a live entry (the common case, one round trip). When the
// key has one, DynamoDB sends it back with the failed condition (a
// read more from an API that does not); a done entry is then answered, an
// entry of another owner is in flight, and the owner's own entry (a
// resend) or an issued one is taken by a conditional UpdateItem. Given an
// issued entry, it takes it as AcquireIssued does. Errors wrap
// [storage.ErrInvalid] (also for a key over [MaxKeyBytes] or not UTF-8,
// or an owner over [MaxOwnerBytes]) or [storage.ErrCorrupt], or are
// DynamoDB's (unreachable, throttled after the SDK's retries, no table).
func (s *Store) Acquire(ctx context.Context, key, owner, fingerprint string, lease time.Duration) (storage.Result, error) {
	if err := checkAcquire(key, owner, fingerprint, lease); err != nil {
		return storage.Result{}, fmt.Errorf("dynamostore: acquire: %w", err)
	}
	res, err := s.acquire(ctx, key, owner, fingerprint, lease, false)
	if err != nil {
		return storage.Result{}, fmt.Errorf("dynamostore: acquire: %w", err)
	}
	return res, nil
}

// AcquireIssued implements [storage.Issuer.AcquireIssued]: one conditional
// UpdateItem that takes a live issued entry; otherwise as Acquire. Errors
// as Acquire's.
func (s *Store) AcquireIssued(ctx context.Context, key, owner, fingerprint string, lease time.Duration) (storage.Result, error) {
	if err := checkAcquire(key, owner, fingerprint, lease); err != nil {
		return storage.Result{}, fmt.Errorf("dynamostore: acquire issued: %w", err)
	}
	res, err := s.acquire(ctx, key, owner, fingerprint, lease, true)
	if err != nil {
		return storage.Result{}, fmt.Errorf("dynamostore: acquire issued: %w", err)
	}
	return res, nil
}

// acquire is Acquire (issued false) and AcquireIssued (true). Each step is
// a conditional write decided by the item the previous one found; a write
// whose condition fails because another call changed the item meanwhile
// leads to another step, at most attempts in all.
func (s *Store) acquire(ctx context.Context, key, owner, fingerprint string, lease time.Duration, issued bool) (storage.Result, error) {
	var (
		ok  bool
		cur item
		err error
	)
	if issued {
		ok, cur, err = s.take(ctx, key, owner, fingerprint, lease)
	} else {
		ok, cur, err = s.create(ctx, key, owner, fingerprint, lease)
	}
	for i := 1; ; i++ {
		switch {
		case err != nil:
			return storage.Result{}, err
		case ok:
			return storage.Result{State: storage.Acquired}, nil
		case i == attempts:
			return storage.Result{}, fmt.Errorf("the item changed under %d conditional writes in a row", attempts)
		}
		now := s.nowMs()
		switch {
		case !cur.live(now) && issued:
			return storage.Result{State: storage.NotIssued}, nil
		case !cur.live(now):
			ok, cur, err = s.create(ctx, key, owner, fingerprint, lease)
		case cur.state == stateDone:
			rec, err := cur.decoded()
			if err != nil {
				return storage.Result{}, err
			}
			return storage.Result{State: storage.Done, Fingerprint: cur.fingerprint, Record: rec}, nil
		case cur.state == stateProcessing && cur.owner == owner:
			ok, cur, err = s.renew(ctx, key, owner, lease)
		case cur.state == stateProcessing:
			left := time.Duration(cur.expires-now) * time.Millisecond
			return storage.Result{State: storage.InFlight, Fingerprint: cur.fingerprint, LeaseLeft: max(left, time.Millisecond)}, nil
		default: // issued
			ok, cur, err = s.take(ctx, key, owner, fingerprint, lease)
		}
	}
}

// create puts a processing entry under a key that has no live entry.
func (s *Store) create(ctx context.Context, key, owner, fingerprint string, lease time.Duration) (bool, item, error) {
	now := s.nowMs()
	exp := now + ms(lease)
	_, err := s.db.PutItem(ctx, &dynamodb.PutItemInput{
		TableName: s.table,
		Item: map[string]types.AttributeValue{
			attrKey: sv(key), attrState: sv(stateProcessing), attrOwner: bv(owner), attrFingerprint: bv(fingerprint),
			attrExpires: nv(exp), attrTTL: nv(ttlSeconds(exp)), attrSince: nv(now),
		},
		ConditionExpression:                 aws.String(condFree),
		ExpressionAttributeNames:            namesFree,
		ExpressionAttributeValues:           map[string]types.AttributeValue{":now": nv(now)},
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	return s.outcome(ctx, key, err)
}

// take turns a live issued entry into the owner's processing entry; it
// keeps the issue's TTL.
func (s *Store) take(ctx context.Context, key, owner, fingerprint string, lease time.Duration) (bool, item, error) {
	now := s.nowMs()
	exp := now + ms(lease)
	_, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                s.table,
		Key:                      keyOf(key),
		UpdateExpression:         aws.String(updTake),
		ConditionExpression:      aws.String(condIssued),
		ExpressionAttributeNames: namesTake,
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":processing": sv(stateProcessing), ":issued": sv(stateIssued), ":owner": bv(owner), ":fp": bv(fingerprint),
			":ex": nv(exp), ":ttl": nv(ttlSeconds(exp)), ":now": nv(now),
		},
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	return s.outcome(ctx, key, err)
}

// renew renews the lease of the owner's live processing entry (a resent
// Acquire); Since stays.
func (s *Store) renew(ctx context.Context, key, owner string, lease time.Duration) (bool, item, error) {
	_, err := s.extend(ctx, key, owner, lease, types.ReturnValuesOnConditionCheckFailureAllOld)
	return s.outcome(ctx, key, err)
}

func (s *Store) extend(ctx context.Context, key, owner string, lease time.Duration, onFail types.ReturnValuesOnConditionCheckFailure) (*dynamodb.UpdateItemOutput, error) {
	now := s.nowMs()
	exp := now + ms(lease)
	return s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           s.table,
		Key:                                 keyOf(key),
		UpdateExpression:                    aws.String(updExtend),
		ConditionExpression:                 aws.String(condHeld),
		ExpressionAttributeNames:            namesHeld,
		ExpressionAttributeValues:           map[string]types.AttributeValue{":processing": sv(stateProcessing), ":owner": bv(owner), ":ex": nv(exp), ":ttl": nv(ttlSeconds(exp)), ":now": nv(now)},
		ReturnValuesOnConditionCheckFailure: onFail,
	})
}

// outcome maps a conditional write's error: (true, _, nil) when it was
// done; (false, the item in the way, nil) when its condition failed.
func (s *Store) outcome(ctx context.Context, key string, err error) (bool, item, error) {
	if err == nil {
		return true, item{}, nil
	}
	it, failed, err := s.conflict(ctx, key, err)
	if !failed {
		return false, item{}, err
	}
	return false, it, err
}

// Issue implements [storage.Issuer.Issue]: one conditional PutItem.
// Errors wrap [storage.ErrExists] or [storage.ErrInvalid], or are
// DynamoDB's.
func (s *Store) Issue(ctx context.Context, key string, ttl time.Duration) error {
	if err := checkKey(key); err != nil {
		return fmt.Errorf("dynamostore: issue: %w", err)
	}
	if ttl <= 0 {
		return fmt.Errorf("dynamostore: issue: %w: ttl %v", storage.ErrInvalid, ttl)
	}
	now := s.nowMs()
	exp := now + ms(ttl)
	_, err := s.db.PutItem(ctx, &dynamodb.PutItemInput{
		TableName: s.table,
		Item: map[string]types.AttributeValue{
			attrKey: sv(key), attrState: sv(stateIssued), attrExpires: nv(exp), attrTTL: nv(ttlSeconds(exp)),
			attrSince: nv(now), attrIssueTTL: nv(ms(ttl)),
		},
		ConditionExpression:       aws.String(condFree),
		ExpressionAttributeNames:  namesFree,
		ExpressionAttributeValues: map[string]types.AttributeValue{":now": nv(now)},
	})
	if ccf := (*types.ConditionalCheckFailedException)(nil); errors.As(err, &ccf) {
		return fmt.Errorf("dynamostore: issue: %w", storage.ErrExists)
	}
	if err != nil {
		return fmt.Errorf("dynamostore: issue: %w", err)
	}
	return nil
}

// Complete implements [storage.Store.Complete]: one conditional
// UpdateItem. A record over 4 KiB is stored compressed when that saves an
// eighth of it (see Records in the package documentation). When the
// condition fails, the item in the way tells a resend (done by this owner
// with this record: nil) from ErrNotOwner. A record longer than
// WithMaxRecordBytes allows, or over [MaxStoredRecordBytes] once
// compressed, is [storage.ErrTooLarge], found before anything is sent.
// Errors wrap [storage.ErrNotOwner], [storage.ErrTooLarge] or
// [storage.ErrInvalid], or are DynamoDB's.
func (s *Store) Complete(ctx context.Context, key, owner string, record []byte, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("dynamostore: complete: %w: ttl %v", storage.ErrInvalid, ttl)
	}
	if err := checkKey(key); err != nil {
		return fmt.Errorf("dynamostore: complete: %w", err)
	}
	if len(record) > s.maxRecord {
		return fmt.Errorf("dynamostore: complete: %w: %d bytes, at most %d", storage.ErrTooLarge, len(record), s.maxRecord)
	}
	stored, upd := record, updComplete
	if len(record) > compressAbove {
		if z := deflate(record); z != nil {
			defer putBuffer(z)
			stored, upd = z.Bytes(), updCompleteZ
		}
	}
	if len(stored) > MaxStoredRecordBytes {
		return fmt.Errorf("dynamostore: complete: %w: %d bytes, %d once compressed, at most %d in an item",
			storage.ErrTooLarge, len(record), len(stored), MaxStoredRecordBytes)
	}
	if stored == nil {
		stored = []byte{}
	}
	// stored is sent as it is: the SDK encodes it during the call and
	// keeps nothing after, so the caller may reuse record once Complete
	// returns.
	now := s.nowMs()
	exp := now + ms(ttl)
	_, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                s.table,
		Key:                      keyOf(key),
		UpdateExpression:         aws.String(upd),
		ConditionExpression:      aws.String(condHeld),
		ExpressionAttributeNames: namesComplete,
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":processing": sv(stateProcessing), ":done": sv(stateDone), ":owner": bv(owner),
			":rec": &types.AttributeValueMemberB{Value: stored}, ":sz": nv(int64(len(record))),
			":ex": nv(exp), ":ttl": nv(ttlSeconds(exp)), ":now": nv(now),
		},
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if err == nil {
		return nil
	}
	if tooLarge(err) {
		return fmt.Errorf("dynamostore: complete: %w: %w", storage.ErrTooLarge, err)
	}
	cur, failed, err := s.conflict(ctx, key, err)
	if err != nil {
		return fmt.Errorf("dynamostore: complete: %w", err)
	}
	if failed && cur.live(s.nowMs()) && cur.state == stateDone && cur.owner == owner {
		rec, err := cur.decoded()
		if err != nil {
			return fmt.Errorf("dynamostore: complete: %w", err)
		}
		if bytes.Equal(rec, record) {
			return nil // a resend
		}
	}
	return fmt.Errorf("dynamostore: complete: %w", storage.ErrNotOwner)
}

// Release implements [storage.Store.Release]: one conditional DeleteItem
// of the owner's processing entry; an entry taken from an issue goes back
// to issued instead, for the issue's whole TTL (a conditional UpdateItem
// after the DeleteItem's condition failed on it). Errors wrap
// [storage.ErrNotOwner], or are DynamoDB's.
func (s *Store) Release(ctx context.Context, key, owner string) error {
	if err := checkKey(key); err != nil {
		return fmt.Errorf("dynamostore: release: %w", err)
	}
	ok, cur, err := s.drop(ctx, key, owner)
	for i := 1; ; i++ {
		switch {
		case err != nil:
			return fmt.Errorf("dynamostore: release: %w", err)
		case ok:
			return nil
		case i == attempts:
			return fmt.Errorf("dynamostore: release: the item changed under %d conditional writes in a row", attempts)
		}
		now := s.nowMs()
		switch {
		case !cur.live(now), cur.state == stateIssued:
			return nil // nothing held: a resend, or the lease ran out
		case cur.state != stateProcessing || cur.owner != owner:
			return fmt.Errorf("dynamostore: release: %w", storage.ErrNotOwner)
		case cur.issueTTL > 0:
			ok, cur, err = s.reissue(ctx, key, owner, cur.issueTTL)
		default:
			// The owner's entry, not taken from an issue: it was just
			// renewed or taken again after the condition was checked.
			// The DeleteItem again.
			ok, cur, err = s.drop(ctx, key, owner)
		}
	}
}

// drop deletes the owner's processing entry, unless it is live and was
// taken from an issue.
func (s *Store) drop(ctx context.Context, key, owner string) (bool, item, error) {
	_, err := s.db.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName:                           s.table,
		Key:                                 keyOf(key),
		ConditionExpression:                 aws.String(condReleased),
		ExpressionAttributeNames:            namesReleased,
		ExpressionAttributeValues:           map[string]types.AttributeValue{":processing": sv(stateProcessing), ":owner": bv(owner), ":now": nv(s.nowMs())},
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	return s.outcome(ctx, key, err)
}

// reissue turns the owner's live processing entry taken from an issue of
// ttl ms back into an issued entry, for ttl from now.
func (s *Store) reissue(ctx context.Context, key, owner string, ttl int64) (bool, item, error) {
	now := s.nowMs()
	exp := now + ttl
	_, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                s.table,
		Key:                      keyOf(key),
		UpdateExpression:         aws.String(updReissue),
		ConditionExpression:      aws.String(condReissue),
		ExpressionAttributeNames: namesReissue,
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":processing": sv(stateProcessing), ":issued": sv(stateIssued), ":owner": bv(owner), ":it": nv(ttl),
			":ex": nv(exp), ":ttl": nv(ttlSeconds(exp)), ":now": nv(now),
		},
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	return s.outcome(ctx, key, err)
}

// Extend implements [storage.Store.Extend]: one conditional UpdateItem.
// Errors wrap [storage.ErrNotOwner] or [storage.ErrInvalid], or are
// DynamoDB's.
func (s *Store) Extend(ctx context.Context, key, owner string, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("dynamostore: extend: %w: lease %v", storage.ErrInvalid, lease)
	}
	if err := checkKey(key); err != nil {
		return fmt.Errorf("dynamostore: extend: %w", err)
	}
	_, err := s.extend(ctx, key, owner, lease, types.ReturnValuesOnConditionCheckFailureNone)
	if ccf := (*types.ConditionalCheckFailedException)(nil); errors.As(err, &ccf) {
		return fmt.Errorf("dynamostore: extend: %w", storage.ErrNotOwner)
	}
	if err != nil {
		return fmt.Errorf("dynamostore: extend: %w", err)
	}
	return nil
}
