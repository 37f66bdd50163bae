// Package response holds the little an adapter needs beside the root
// package, written for whoever connects idem to another framework:
// [ReplayedHeader], the header that marks a replay, and [Innermost], which
// finds the server's own writer under the wrappers.
//
// An adapter calls [idem.Middleware.Serve] with the request, the writer the
// handlers would use, its route pattern, and an [idem.Next] that runs the
// rest of the chain. Next gets the writer the handlers must write through:
// the one given to Serve when the request is not protected, and when it is,
// a writer of the middleware's that sends the response as it records it.
// An adapter whose framework keeps a writer of its own (Gin's c.Writer,
// Echo's Response) puts one on top of the writer Next gets when it is not
// the one given to Serve; ginidem and echoidem, in this repository, are the
// models. The middleware's writer implements http.Flusher,
// http.Hijacker, io.StringWriter and the FlushError method of
// [http.ResponseController], and unwraps to the writer given to Serve;
// an adapter asks [Innermost] for the features a wrapper must not claim on
// the server's behalf (http.Pusher, http.CloseNotifier).
//
// How the middleware records, stores and replays a response (byte for
// byte, its status, headers, trailers and body, with a checksum) is
// documented in the root package.
package response

import "net/http"

// ReplayedHeader is the response header that the middleware sets to "true"
// on a replayed response, so that a client can tell it from the original.
const ReplayedHeader = "Idempotent-Replayed"

// Innermost follows Unwrap (the method [http.ResponseController] uses) from
// w down to the writer that has none, normally the server's own, and
// returns it. Adapters ask it for the features a wrapper must not claim on
// the inner writer's behalf (Hijacker, Pusher, CloseNotifier), and the
// middleware hands it to [http.MaxBytesReader], which closes the
// connection only through the server's own writer.
func Innermost(w http.ResponseWriter) http.ResponseWriter {
	for {
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return w
		}
		w = u.Unwrap()
	}
}
