package redisproto

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/idemkit/idem/storage"
)

// Cursor is where a listing goes on: the keys that an earlier SCAN found
// and no page has shown yet, then the SCAN cursor on the node of that
// address (none: the listing ends with the keys). The store lists the
// nodes (masters of a cluster, shards of a ring, or the one server) in
// the order of their addresses. Its text is base64url of its JSON.
type Cursor struct {
	Node string   `json:"n"`
	Scan uint64   `json:"c,omitempty"`
	Keys []string `json:"k,omitempty"`
}

func (c Cursor) String() string {
	b, _ := json.Marshal(c) // cannot fail
	return base64.RawURLEncoding.EncodeToString(b)
}

// ParseCursor reads a Page.Next that a listing made; "" is the start.
// Errors wrap [storage.ErrInvalid].
func ParseCursor(s string) (Cursor, error) {
	var c Cursor
	if s == "" {
		return c, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil {
		err = json.Unmarshal(b, &c)
	}
	if err != nil || (c.Node == "" && len(c.Keys) == 0) {
		return Cursor{}, fmt.Errorf("%w: cursor %q was not made by this store", storage.ErrInvalid, s)
	}
	return c, nil
}

// Match is the SCAN MATCH pattern of every key under prefix: the prefix
// with the characters a pattern gives a meaning to escaped, then *.
func Match(prefix string) string {
	var b strings.Builder
	for _, r := range prefix {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	b.WriteByte('*')
	return b.String()
}
