package idem

import (
	"crypto/rand"
	"encoding/hex"
	"sync"
)

// appendOwner appends a random lease owner token: ownerLen hex digits (128
// bits from crypto/rand). A token is never handed out twice, so it also
// serves as a fencing token (see [Info.Owner]).
func appendOwner(b []byte) []byte {
	p := randPool.Get().(*randBytes)
	if p.off+ownerLen/2 > len(p.b) {
		rand.Read(p.b[:])
		p.off = 0
	}
	b = hex.AppendEncode(b, p.b[p.off:p.off+ownerLen/2])
	clear(p.b[p.off : p.off+ownerLen/2]) // handed out once only
	p.off += ownerLen / 2
	randPool.Put(p)
	return b
}

// randBytes is a batch of bytes from crypto/rand, used from off on: one
// call of rand.Read for 64 owner tokens costs less than one per token. A
// batch belongs to one goroutine at a time (through randPool), so no two
// tokens share bytes.
type randBytes struct {
	b   [64 * ownerLen / 2]byte
	off int
}

var randPool = sync.Pool{New: func() any { return &randBytes{off: len(randBytes{}.b)} }}
