package idemotel

import (
	"context"
	"errors"
	"reflect"
	"time"

	"github.com/idemkit/idem/storage"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// storeOp is a store call, the idem.store.operation attribute.
type storeOp uint8

const (
	opAcquire storeOp = iota
	opAcquireIssued
	opIssue
	opComplete
	opRelease
	opExtend
	opLookup
	opList
	opRemove
	numOps
)

var opNames = [numOps]string{
	opAcquire: "acquire", opAcquireIssued: "acquire_issued", opIssue: "issue", opComplete: "complete",
	opRelease: "release", opExtend: "extend", opLookup: "lookup", opList: "list", opRemove: "remove",
}

// spanNames are the names of the spans of store calls, by storeOp.
var spanNames = func() (n [numOps]string) {
	for op, name := range opNames {
		n[op] = "idem.store " + name
	}
	return n
}()

// errClass is the class of a store call's error, the error.type
// attribute: never the error's text, which may quote what the store was
// given.
type errClass uint8

const (
	classNone errClass = iota // the call succeeded
	classNotOwner
	classFull
	classInvalid
	classExists
	classNotFound
	classChanged
	classTimeout
	classCanceled
	classOther
	numClasses
)

var classNames = [numClasses]string{
	classNotOwner: "not_owner", classFull: "full", classInvalid: "invalid", classExists: "exists",
	classNotFound: "not_found", classChanged: "changed", classTimeout: "timeout", classCanceled: "canceled", classOther: "other",
}

// classify returns the class of a store's error.
func classify(err error) errClass {
	switch {
	case err == nil:
		return classNone
	case errors.Is(err, storage.ErrNotOwner):
		return classNotOwner
	case errors.Is(err, storage.ErrFull):
		return classFull
	case errors.Is(err, storage.ErrInvalid):
		return classInvalid
	case errors.Is(err, storage.ErrExists):
		return classExists
	case errors.Is(err, storage.ErrNotFound):
		return classNotFound
	case errors.Is(err, storage.ErrChanged):
		return classChanged
	case errors.Is(err, context.DeadlineExceeded):
		return classTimeout
	case errors.Is(err, context.Canceled):
		return classCanceled
	}
	return classOther
}

// answer reports whether an error of class c is an answer of the store
// (the entry is not this owner's, exists, does not, or changed), which
// leaves a span's status unset, rather than a failure.
func (c errClass) answer() bool {
	return c == classNotOwner || c == classExists || c == classNotFound || c == classChanged
}

// storeKinds names the stores of this kit by their package, for
// idem.store.
var storeKinds = map[string]string{
	"github.com/idemkit/idem/storage/memstore":   "memory",
	"github.com/idemkit/idem/storage/redisstore": "redis",
	"github.com/idemkit/idem/storage/pgstore":    "postgres",
}

// storeName returns the kind of s, from its Go type: "memory", "redis",
// "postgres", or "custom".
func storeName(s storage.Store) string {
	t := reflect.TypeOf(s)
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if name, ok := storeKinds[t.PkgPath()]; ok {
		return name
	}
	return "custom"
}

// Store returns s wrapped so that each of its calls is measured in
// idem.store.operation.duration and traced by a client span (see the
// package documentation), for idem.New. The wrapper has the optional
// interfaces that s has, and only those: it is a storage.Issuer (for
// idem.WithIssuedKeys) when s is one, and a storage.Inspector (for
// idemadmin) when s is one. It hands every call to s with the same
// arguments, so the storage.Lease in a handler's context names the
// entry as s knows it, and a fence such as pgstore's Store.Fence, called
// on s itself, works as without the wrapper. Closing the store is for s:
// the wrapper has no Close. A nil s gives nil.
func (t *Telemetry) Store(s storage.Store) storage.Store {
	if s == nil {
		return nil
	}
	w := &traced{t: t, s: s, name: t.storeName}
	if w.name == "" {
		w.name = storeName(s)
	}
	w.storeAttr = attrStore.String(w.name)
	for op := range numOps {
		w.opAttrs[op] = attrStoreOp.String(opNames[op])
		for c := range numClasses {
			attrs := []attribute.KeyValue{w.storeAttr, w.opAttrs[op]}
			if c != classNone {
				attrs = append(attrs, attrErrorType.String(classNames[c]))
			}
			w.measurements[op][c] = newMeasurement(attrs...)
		}
	}
	iss, isIssuer := s.(storage.Issuer)
	ins, isInspector := s.(storage.Inspector)
	switch {
	case isIssuer && isInspector:
		return issuerInspector{w, issuing{w, iss}, inspecting{w, ins}}
	case isIssuer:
		return issuer{w, issuing{w, iss}}
	case isInspector:
		return inspector{w, inspecting{w, ins}}
	}
	return w
}

// The wrappers of the four kinds of stores: each has the methods of the
// interfaces its store has.
type (
	issuer struct {
		*traced
		issuing
	}
	inspector struct {
		*traced
		inspecting
	}
	issuerInspector struct {
		*traced
		issuing
		inspecting
	}
)

// traced wraps a storage.Store: each call is measured and traced.
type traced struct {
	t            *Telemetry
	s            storage.Store
	name         string
	storeAttr    attribute.KeyValue
	opAttrs      [numOps]attribute.KeyValue
	measurements [numOps][numClasses]measurement
}

// start starts the span of a call of op on key (none for "") when t
// traces, and returns the context for the store and the call's start.
func (w *traced) start(ctx context.Context, op storeOp, key string) (context.Context, trace.Span, time.Time) {
	var span trace.Span
	if w.t.traces() {
		attrs := []attribute.KeyValue{w.storeAttr, w.opAttrs[op]}
		if key != "" {
			attrs = append(attrs, attrStorageKey.String(key))
		}
		ctx, span = w.t.tracer.Start(ctx, spanNames[op], trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	}
	return ctx, span, time.Now()
}

// end records the call of op that started at begin and ended with err,
// and ends its span.
func (w *traced) end(ctx context.Context, op storeOp, span trace.Span, begin time.Time, err error) {
	c := classify(err)
	w.t.storeCalls.Record(ctx, time.Since(begin).Seconds(), w.measurements[op][c].record...)
	if span == nil {
		return
	}
	if c != classNone {
		span.SetAttributes(attrErrorType.String(classNames[c]))
		if !c.answer() {
			span.SetStatus(codes.Error, classNames[c])
		}
	}
	span.End()
}

// Acquire implements storage.Store.
func (w *traced) Acquire(ctx context.Context, key, owner, fingerprint string, lease time.Duration) (storage.Result, error) {
	ctx, span, begin := w.start(ctx, opAcquire, key)
	res, err := w.s.Acquire(ctx, key, owner, fingerprint, lease)
	w.end(ctx, opAcquire, span, begin, err)
	return res, err
}

// Complete implements storage.Store.
func (w *traced) Complete(ctx context.Context, key, owner string, record []byte, ttl time.Duration) error {
	ctx, span, begin := w.start(ctx, opComplete, key)
	err := w.s.Complete(ctx, key, owner, record, ttl)
	w.end(ctx, opComplete, span, begin, err)
	return err
}

// Release implements storage.Store.
func (w *traced) Release(ctx context.Context, key, owner string) error {
	ctx, span, begin := w.start(ctx, opRelease, key)
	err := w.s.Release(ctx, key, owner)
	w.end(ctx, opRelease, span, begin, err)
	return err
}

// Extend implements storage.Store.
func (w *traced) Extend(ctx context.Context, key, owner string, lease time.Duration) error {
	ctx, span, begin := w.start(ctx, opExtend, key)
	err := w.s.Extend(ctx, key, owner, lease)
	w.end(ctx, opExtend, span, begin, err)
	return err
}

// issuing holds the methods of storage.Issuer.
type issuing struct {
	w *traced
	s storage.Issuer
}

// Issue implements storage.Issuer.
func (i issuing) Issue(ctx context.Context, key string, ttl time.Duration) error {
	ctx, span, begin := i.w.start(ctx, opIssue, key)
	err := i.s.Issue(ctx, key, ttl)
	i.w.end(ctx, opIssue, span, begin, err)
	return err
}

// AcquireIssued implements storage.Issuer.
func (i issuing) AcquireIssued(ctx context.Context, key, owner, fingerprint string, lease time.Duration) (storage.Result, error) {
	ctx, span, begin := i.w.start(ctx, opAcquireIssued, key)
	res, err := i.s.AcquireIssued(ctx, key, owner, fingerprint, lease)
	i.w.end(ctx, opAcquireIssued, span, begin, err)
	return res, err
}

// inspecting holds the methods of storage.Inspector.
type inspecting struct {
	w *traced
	s storage.Inspector
}

// Lookup implements storage.Inspector.
func (i inspecting) Lookup(ctx context.Context, key string, withRecord bool) (storage.Entry, error) {
	ctx, span, begin := i.w.start(ctx, opLookup, key)
	e, err := i.s.Lookup(ctx, key, withRecord)
	i.w.end(ctx, opLookup, span, begin, err)
	return e, err
}

// List implements storage.Inspector.
func (i inspecting) List(ctx context.Context, q storage.Query) (storage.Page, error) {
	ctx, span, begin := i.w.start(ctx, opList, "")
	p, err := i.s.List(ctx, q)
	i.w.end(ctx, opList, span, begin, err)
	return p, err
}

// Remove implements storage.Inspector.
func (i inspecting) Remove(ctx context.Context, key, version string) (storage.Entry, error) {
	ctx, span, begin := i.w.start(ctx, opRemove, key)
	e, err := i.s.Remove(ctx, key, version)
	i.w.end(ctx, opRemove, span, begin, err)
	return e, err
}
