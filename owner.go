package idem

import (
	"crypto/rand"
	"encoding/hex"
)

// appendOwner appends a random lease owner token: ownerLen hex digits (128
// bits from crypto/rand). A token is never handed out twice, so it also
// serves as a fencing token (see [Info.Owner]).
func appendOwner(b []byte) []byte {
	var r [ownerLen / 2]byte
	rand.Read(r[:]) // never fails (Go 1.24 and later)
	return hex.AppendEncode(b, r[:])
}
