package dynamostore

import (
	"bytes"
	"compress/flate"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/idemkit/idem/storage"
)

// The attributes of an item (see the package documentation's Table). Every
// expression names them through placeholders (#st for state, ...): several
// are DynamoDB reserved words.
const (
	attrKey         = "id"           // S: the storage key; the table's partition key
	attrState       = "state"        // S: processing, done or issued
	attrOwner       = "owner"        // B: the owner token (processing, done)
	attrFingerprint = "fingerprint"  // B: the request's fingerprint (processing, done)
	attrRecord      = "record"       // B: a done entry's record, as given
	attrRecordZ     = "record_z"     // B: a done entry's record, compressed (raw DEFLATE)
	attrSize        = "size"         // N: a done entry's record length, before compression
	attrExpires     = "expires_ms"   // N: Unix ms when the lease (processing) or the TTL ends
	attrTTL         = "ttl"          // N: Unix seconds, for DynamoDB's TTL: expires_ms, rounded up
	attrSince       = "since_ms"     // N: Unix ms when the entry entered its state
	attrIssueTTL    = "issue_ttl_ms" // N: the TTL of the issue a processing entry was taken from
)

// The values of attrState.
const (
	stateProcessing = "processing"
	stateDone       = "done"
	stateIssued     = "issued"
)

// item is an entry as read from the table. A zero item is no entry.
type item struct {
	present     bool
	state       string
	owner       string
	fingerprint string
	record      []byte // nil unless done (and read with its record)
	compressed  bool   // record is attrRecordZ's, still compressed
	size        int
	expires     int64 // Unix ms
	since       int64 // Unix ms
	issueTTL    int64 // ms; 0 when not taken from an issue
}

// live reports whether the entry exists at now (Unix ms): DynamoDB's TTL
// deletes an expired item late (within days), so an item whose expires_ms
// has come is treated as absent by every operation, never trusted to be
// gone.
func (it *item) live(now int64) bool { return it.present && it.expires > now }

// parseItem reads an item's attributes. An item with attributes missing or
// of the wrong type, or with an unknown state, is ErrCorrupt: something
// else wrote under the key.
func parseItem(m map[string]types.AttributeValue) (item, error) {
	if len(m) == 0 {
		return item{}, nil
	}
	it := item{present: true}
	bad := func(name string) (item, error) {
		return item{}, fmt.Errorf("%w: attribute %s missing or not of its type", storage.ErrCorrupt, name)
	}
	var ok bool
	if it.state, ok = str(m[attrState]); !ok {
		return bad(attrState)
	}
	if it.expires, ok = num(m[attrExpires]); !ok {
		return bad(attrExpires)
	}
	if v, found := m[attrSince]; found {
		if it.since, ok = num(v); !ok {
			return bad(attrSince)
		}
	}
	switch it.state {
	case stateIssued:
		return it, nil
	case stateProcessing, stateDone:
	default:
		return item{}, fmt.Errorf("%w: state %q", storage.ErrCorrupt, it.state)
	}
	if it.owner, ok = bin(m[attrOwner]); !ok {
		return bad(attrOwner)
	}
	if v, found := m[attrFingerprint]; found {
		if it.fingerprint, ok = bin(v); !ok {
			return bad(attrFingerprint)
		}
	}
	if v, found := m[attrIssueTTL]; found {
		if it.issueTTL, ok = num(v); !ok {
			return bad(attrIssueTTL)
		}
	}
	if it.state == stateProcessing {
		return it, nil
	}
	if v, found := m[attrSize]; found {
		n, ok := num(v)
		if !ok || n < 0 || n > maxSize {
			return bad(attrSize)
		}
		it.size = int(n)
	}
	if v, found := m[attrRecordZ]; found {
		b, ok := v.(*types.AttributeValueMemberB)
		if !ok {
			return bad(attrRecordZ)
		}
		it.record, it.compressed = b.Value, true
	} else if v, found := m[attrRecord]; found {
		b, ok := v.(*types.AttributeValueMemberB)
		if !ok {
			return bad(attrRecord)
		}
		it.record = b.Value
		if it.record == nil {
			it.record = []byte{}
		}
	}
	return it, nil
}

// decoded returns a done item's record, inflated when it was stored
// compressed.
func (it *item) decoded() ([]byte, error) {
	if !it.compressed {
		return it.record, nil
	}
	return inflate(it.record, it.size)
}

func str(v types.AttributeValue) (string, bool) {
	s, ok := v.(*types.AttributeValueMemberS)
	if !ok {
		return "", false
	}
	return s.Value, true
}

// bin reads a B attribute.
func bin(v types.AttributeValue) (string, bool) {
	b, ok := v.(*types.AttributeValueMemberB)
	if !ok {
		return "", false
	}
	return string(b.Value), true
}

func num(v types.AttributeValue) (int64, bool) {
	n, ok := v.(*types.AttributeValueMemberN)
	if !ok {
		return 0, false
	}
	i, err := strconv.ParseInt(n.Value, 10, 64)
	return i, err == nil
}

// The constructors of attribute values.

func sv(s string) types.AttributeValue { return &types.AttributeValueMemberS{Value: s} }

func nv(i int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(i, 10)}
}

// bv is s as a B; DynamoDB keeps an empty one (outside a key) since 2020.
func bv(s string) types.AttributeValue { return &types.AttributeValueMemberB{Value: []byte(s)} }

// ms gives d in whole milliseconds, rounded up, for a d > 0.
func ms(d time.Duration) int64 {
	n := int64(d / time.Millisecond)
	if d%time.Millisecond != 0 {
		n++
	}
	return n
}

// ttlSeconds is DynamoDB's TTL for an entry that expires at exp (Unix ms):
// the second it ends, rounded up, so the TTL never deletes an item before
// the store itself treats it as gone.
func ttlSeconds(exp int64) int64 { return (exp + 999) / 1000 }

// Compression of records: see the package documentation's Records.

// maxSize bounds a record's size attribute, so that a damaged item
// cannot make inflate allocate without bound.
const maxSize = 1 << 30

// compressAbove is the length from which Complete tries to compress a
// record.
const compressAbove = 4 << 10

var writers = sync.Pool{New: func() any {
	w, _ := flate.NewWriter(nil, flate.BestSpeed)
	return w
}}

// buffers hold compressed records while Complete sends them.
var buffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// deflate compresses record (raw DEFLATE, the fastest level) into a buffer
// of the pool, and returns it when that is shorter by at least an eighth;
// otherwise nil. The caller puts a buffer it got back with putBuffer once
// the request that carries it has returned.
func deflate(record []byte) *bytes.Buffer {
	buf := buffers.Get().(*bytes.Buffer)
	buf.Reset()
	w := writers.Get().(*flate.Writer)
	w.Reset(buf)
	_, err := w.Write(record)
	if err == nil {
		err = w.Close()
	}
	writers.Put(w)
	if err != nil || buf.Len() > len(record)-len(record)/8 {
		putBuffer(buf)
		return nil
	}
	return buf
}

// putBuffer returns buf to the pool, unless it grew past what an item
// holds.
func putBuffer(buf *bytes.Buffer) {
	if buf.Cap() <= MaxItemBytes {
		buffers.Put(buf)
	}
}

var readers = sync.Pool{New: func() any { return flate.NewReader(bytes.NewReader(nil)) }}

// inflate decompresses a record stored compressed, of size bytes.
func inflate(z []byte, size int) ([]byte, error) {
	r := readers.Get().(io.ReadCloser)
	defer readers.Put(r)
	if err := r.(flate.Resetter).Reset(bytes.NewReader(z), nil); err != nil {
		return nil, err
	}
	out := make([]byte, size)
	if _, err := io.ReadFull(r, out); err != nil {
		return nil, fmt.Errorf("%w: compressed record: %v", storage.ErrCorrupt, err)
	}
	return out, nil
}
