package idem

import (
	"errors"
	"fmt"

	"github.com/idemkit/idem/internal/httprec"
	"github.com/idemkit/idem/response"
)

// This file answers a request whose key is done: with the stored
// response, or, when none was kept, with WithRebuild's answer or 409.

// replay answers with a stored record.
func (x *exchange) replay(data []byte, skey string) {
	status, err := httprec.ReplayBinary(x.w, data)
	switch {
	case status == 0 && errors.Is(err, httprec.ErrCorrupt):
		x.refuse(StoreError, newError(ErrCorruptRecord, "The stored response for this idempotency key cannot be read.", 0, err))
	case err == httprec.ErrNotReplayable:
		x.notReplayable(notReplayable(status), skey)
	default:
		// err is the writer's, when the client went away mid-replay.
		x.emit(Replayed, status, err)
	}
}

// notReplayable answers a retry whose first execution completed without a
// response to replay: with WithRebuild's answer, if it gives one, or else
// with e, an ErrNotReplayable.
func (x *exchange) notReplayable(e *Error, skey string) {
	if !x.rebuild(skey) {
		x.refuse(Conflict, e)
	}
}

// rebuild answers a retry whose first execution completed without a kept
// response through WithRebuild's function, if there is one and it answers.
func (x *exchange) rebuild(skey string) bool {
	m := x.m
	if m.cfg.rebuild == nil {
		return false
	}
	h := x.w.Header()
	h.Set(response.ReplayedHeader, "true")
	cw := httprec.NewCapture(x.w, 0, nil) // for the status only
	r := handlerRequest(x.r, x.body, new(handlerState), Info{Key: x.key, StorageKey: skey}, 0)
	if !m.cfg.rebuild(cw, r) {
		h.Del(response.ReplayedHeader)
		return false
	}
	cw.Finish()
	x.emit(Rebuilt, cw.Status(), nil)
	return true
}

// notReplayable is the answer for a key whose execution completed without
// a response to replay: a record stored as not replayable (status is the
// one it had been sent with, or 0), or a committed entry whose response
// was lost (storage.Committed). A request's retry gets WithRebuild's
// answer instead, when it gives one.
func notReplayable(status int) *Error {
	detail := "The original request completed, but its response was not stored and cannot be replayed."
	if status != 0 {
		detail = fmt.Sprintf("The original request completed with status %d, but its response was not stored and cannot be replayed.", status)
	}
	return newError(ErrNotReplayable, detail, 0, nil)
}
