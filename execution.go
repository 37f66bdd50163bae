package idem

import (
	"context"
	"net/http"
	"time"

	"github.com/idemkit/idem/internal/httprec"
)

// handlerState is what a handler's request needs on the heap: the context
// that carries its Info, and its buffered body. It is never reused: a
// handler may keep its request's context.
type handlerState struct {
	ctx  infoCtx
	body bodyReader
}

// execution is one run of a handler, or of Do's function, under the
// lease: the one path that requests and Do share, in one allocation. It
// counts as work for Shutdown, renews the lease while the handler runs,
// turns a panic or runtime.Goexit into a PanicError, and ends the
// execution however the handler ended (finish.go): it keeps the result or
// releases the key, and tells the observer.
type execution struct {
	finish
	handlerState
	fin  finishCtx // the context of the store call that ends it
	beat beat      // its place in the heartbeat queue

	// A request's: the handler's request, and the writer that sends the
	// response as it records it.
	r  *http.Request
	cw *httprec.Capture

	// What Do's function returned, and the largest result it stores.
	result    []byte
	err       error
	maxResult int
}

// run runs the handler, next for a request or fn for Do, under the lease
// and ends the execution. timing is the route (or operation) under which
// the handler's duration is kept for the Retry-After of its duplicates.
// (next and fn are arguments, not fields: kept in the execution, which
// lives on the heap, they would escape, and so would every adapter's
// closure, for every request.)
func (e *execution) run(timing string, next Next, fn func(context.Context) ([]byte, error)) {
	m := e.m
	m.work.add()
	defer m.work.done()
	m.beats.start(&e.beat, e.caller, e.skey, e.owner)
	returned := false
	began := time.Now()
	defer func() {
		if returned {
			return
		}
		// The handler panicked, or called runtime.Goexit (recover then
		// returns nil and the goroutine goes on unwinding; panic(nil) is
		// a *runtime.PanicNilError since Go 1.21).
		p := recover()
		e.handler = time.Since(began)
		e.end(&PanicError{Value: p, Goexit: p == nil})
		if p != nil {
			panic(p)
		}
	}()
	if next != nil {
		next(e.cw, e.r)
	} else {
		e.result, e.err = fn(&e.ctx)
	}
	returned = true
	e.handler = time.Since(began)
	m.runs.observe(timing, e.handler)
	e.end(nil)
}

// end stops the lease's renewals and ends the execution as its handler
// ended: it returned (perr nil) or panicked.
//
// Once any part of a response has gone towards the client, or the handler
// called MarkDone, the execution is done and its key is never released:
// what the client saw may be the effect of work that took place, and a
// retry must not run it again. Only a handler that returned normally with
// a status that is not cacheable (it says it did nothing) and one that
// panicked or gave up before sending anything are released. Do's function
// has sent nothing until it returns a result: its error or panic releases
// the key, unless it called MarkDone.
func (e *execution) end(perr *PanicError) {
	e.m.beats.stop(&e.beat)
	marked := e.ctx.done.Load()
	cw := e.cw
	switch {
	case cw == nil && (perr != nil || e.err != nil):
		var cause error = perr
		if perr == nil {
			cause = e.err
		}
		if marked { // never released
			e.keep(&httprec.Record{Status: http.StatusOK, NotReplayable: true}, false, 0, true, cause)
		} else {
			e.release(Released, 0, cause)
		}
	case cw == nil:
		rec := httprec.Record{Status: http.StatusOK, Body: e.result}
		e.keep(&rec, len(e.result) <= e.maxResult, 0, true, nil)
	case perr != nil && (cw.Sent() || marked):
		// The status line at least has gone out (or the handler said its
		// work is done): the recovery middleware outside cannot answer
		// again, and the client may have seen the work's effect.
		e.keep(&httprec.Record{Status: cw.Status(), NotReplayable: true}, false, cw.Status(), true, perr)
	case perr != nil:
		// Nothing is sent on the handler's behalf: the recovery
		// middleware outside answers.
		e.release(Released, cw.Status(), perr)
	case !cw.Committed() && !cw.Hijacked() && e.caller.Err() != nil && !marked:
		// The handler gave up on its request (the client went away, a
		// deadline passed) and wrote nothing: taken as not done.
		cw.Finish()
		e.release(Canceled, cw.Status(), context.Cause(e.caller))
	default:
		cw.Finish()
		cacheable := cw.Hijacked() || e.m.cfg.cacheable(cw.Status())
		if !cacheable && !marked {
			e.release(Released, cw.Status(), nil)
			return
		}
		rec, whole := cw.Record()
		e.keep(&rec, whole && cacheable, cw.Status(), true, nil)
	}
}
