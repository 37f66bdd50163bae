package grpcidem

import (
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// EncodeResponseRecord returns the record of a response, for the tests.
func EncodeResponseRecord(typeName string, message []byte, header, trailer metadata.MD) []byte {
	b, _ := appendRecord(nil, &record{typeName: protoreflect.FullName(typeName), message: message, header: header, trailer: trailer})
	return b
}

// EncodeStatusRecord returns the record of a status, for the tests.
func EncodeStatusRecord(st *spb.Status, header, trailer metadata.MD) []byte {
	b, _ := appendRecord(nil, &record{status: st, header: header, trailer: trailer})
	return b
}

// Reencode decodes a record and encodes it again.
func Reencode(b []byte) ([]byte, error) {
	r, err := decodeRecord(b)
	if err != nil {
		return nil, err
	}
	return appendRecord(nil, r)
}

// ServerDelay is serverDelay, for the tests.
var ServerDelay = serverDelay

// Backoff returns the wait after attempt n of a client with the given
// backoff, for a server's delay (0: none).
func Backoff(base, max time.Duration, n int, delay time.Duration) time.Duration {
	c := defaultClientConfig()
	c.backoffBase, c.backoffMax = base, max
	return c.wait(n, delay)
}

// Refusal is refusal, for the tests.
var Refusal = refusal
