package redisproto

import (
	"fmt"

	"github.com/idemkit/idem/storage"
)

// DefaultMaxRecord is the longest record a Redis store keeps unless its
// WithMaxRecordBytes says otherwise: Redis's default proto-max-bulk-len
// (512 MB), the most one argument of a command may hold. Complete sends
// the record as one argument.
const DefaultMaxRecord = 512 << 20

// RecordTooLarge returns the error of pkg's Complete of a record of n
// bytes when n is over max, wrapping [storage.ErrTooLarge]; nil when it
// fits. The stores check before sending: a server whose
// proto-max-bulk-len is lower answers "invalid bulk length" and closes the
// connection, which the client sees (as often as not) as a reset, an
// outage the store cannot tell from others, and which fails the requests
// that shared the connection too.
func RecordTooLarge(pkg string, n, max int) error {
	if n <= max {
		return nil
	}
	return fmt.Errorf("%s: complete: %w: %d bytes, at most %d (WithMaxRecordBytes)", pkg, storage.ErrTooLarge, n, max)
}
