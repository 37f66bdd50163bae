// Package httprec captures an HTTP response as the client received it,
// encodes it compactly, and replays it byte for byte. It is internal to
// the kit (the root package's engine): adapters get its [Capture] as the
// writer idem.Next receives, and need nothing else from it.
//
// The parts: [Capture] wraps the handler's [http.ResponseWriter], tees the
// response to the client and keeps a copy; [Capture.Record] turns the copy
// into a [Record]; [Record.MarshalBinary] and [Record.UnmarshalBinary] move it
// through a store; [Replay] writes it to a later client.
//
// # What is recorded
//
// The final status (never a 1xx informational response), the header map as it
// was when the status went to the client (minus the names [Omitted] reports,
// those the caller's omit function rejects, and those that were already in the
// map with the same values when the capture was made: they belong to the
// middleware outside it, which sets them again for a replay), the trailers,
// and the body: every byte the handler wrote, whatever the connection
// accepted. When a write failed (the client went away, a write deadline
// passed) and no Content-Length that the handler wrote in full tells a
// complete body from one it cut short, the response is not replayable.
// When net/http would have sniffed a Content-Type, the capture decides it
// itself (see below) and writes it into the header map, so the record holds
// the Content-Type the client actually received. When the client received no
// Content-Type although the status allows a body (the first body bytes came
// after a Flush, or a Content-Encoding or Transfer-Encoding prevented
// sniffing), the record holds a Content-Type key with no values, which tells
// net/http not to sniff on replay.
//
// # Encoding and integrity
//
// [Record.MarshalBinary] and [Record.AppendBinary] write encoding version 2:
// the record followed by a CRC-32C of its bytes. [Record.UnmarshalBinary]
// and [ReplayBinary] verify that checksum before reading anything past the
// version byte, so a record damaged in the store (one flipped bit is
// enough) is an error wrapping [ErrCorrupt], which the idem middleware
// answers with 500 ErrCorruptRecord without replaying it or running the
// handler again, instead of a replay with a changed status, header or body.
// The checksum guards against accidents, not against someone who can write
// the store.
//
// Both still accept version 1, the encoding of the releases before the
// checksum, which has none: such records stay in the store for their TTL
// (24 hours by default) after an upgrade and replay as before. Those
// releases cannot read version 2, though: during a rolling upgrade, a retry
// that reaches a process still on an older release after a newer one
// stored its record gets 500 ErrCorruptRecord (never a second execution)
// until the upgrade is complete.
//
// # Differences from a bare net/http response writer
//
// A Capture behaves like the writer it wraps except in these documented ways:
//
//   - The final status is passed to the inner writer at the first non-empty
//     Write, Flush, Hijack or Finish, not at WriteHeader. Header edits made
//     between WriteHeader and that moment therefore reach the client (and the
//     record), where net/http alone would ignore them. Only handlers that edit
//     headers after WriteHeader see a difference; with gin, which sends
//     headers at the first Write anyway, there is none.
//   - The sniffed Content-Type is computed from the first non-empty Write
//     alone, where net/http sniffs whatever it has buffered (up to 2 KiB)
//     when it sends the header. The two differ only when the first Write is a
//     fragment too short to recognise (for example "<ht" followed by
//     "ml>..."): the client then gets "text/plain; charset=utf-8" instead of
//     "text/html; charset=utf-8". Original and replay always agree.
//   - The sniffed Content-Type is set in the header map, so the handler sees it
//     in w.Header() after its first Write; net/http keeps it out of the map.
//   - Informational responses (100, 102, 103) are sent at once, as net/http
//     does, but are not recorded, so a replay does not repeat them.
//   - Trailers set with [http.TrailerPrefix] are recorded and always replayed.
//     Over HTTP/1.1, net/http drops them from an original response that it
//     sends with a Content-Length (a short body written without a Flush);
//     a replay sends them.
//   - Flush and Hijack are always present as methods; when the inner writer
//     (or anything it unwraps to) lacks them they return an error wrapping
//     [http.ErrNotSupported], like [http.ResponseController] does. A Flush
//     after a Hijack returns [http.ErrHijacked] where net/http would panic.
//   - io.ReaderFrom is deliberately not implemented, so io.Copy goes through
//     Write and is captured; http.CloseNotifier is not implemented either.
package httprec
