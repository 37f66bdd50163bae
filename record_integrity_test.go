package idem_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/memstore"
)

// tamperStore stores a copy of every completed record that holds mark,
// which the test puts in a header value, with the lowest bit of mark's
// eleventh byte flipped ("application/json" becomes "applicatioo/json").
// It stands for a store whose bytes changed after they were written.
type tamperStore struct {
	storage.Store
	mark     []byte
	tampered atomic.Int32
	key      atomic.Value // the key of the last record tampered with
}

func (s *tamperStore) Complete(ctx context.Context, key, owner string, rec []byte, ttl time.Duration) error {
	if i := bytes.Index(rec, s.mark); i >= 0 {
		rec = bytes.Clone(rec)
		rec[i+10] ^= 0x01
		s.tampered.Add(1)
		s.key.Store(key)
	}
	return s.Store.Complete(ctx, key, owner, rec, ttl)
}

// TestRecordIntegrityFlippedHeaderByte: a record whose header section
// changed by one bit in the store is not replayed (before the checksum, it
// was replayed as a normal 201 with the changed header): a retry gets 500
// ErrCorruptRecord, every time, and the handler ran only once.
func TestRecordIntegrityFlippedHeaderByte(t *testing.T) {
	mem := memstore.New()
	t.Cleanup(func() { mem.Close() })
	store := &tamperStore{Store: mem, mark: []byte("application/json")}
	var events []idem.Event
	m, err := idem.New(store, idem.WithObserver(func(e idem.Event) { events = append(events, e) }))
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	h := nethttp.Middleware(m)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/orders/42")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":42}`)
	}))
	send := func() *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"sku":"A-1"}`))
		r.Header.Set("Idempotency-Key", "integrity-1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}

	if w := send(); w.Code != http.StatusCreated || w.Body.String() != `{"id":42}` {
		t.Fatalf("first request: %d %q", w.Code, w.Body)
	}
	if store.tampered.Load() != 1 {
		t.Fatalf("the record was not tampered with (%d): the mark is not in it", store.tampered.Load())
	}
	key, _ := store.key.Load().(string)
	res, err := mem.Acquire(context.Background(), key, "someone", "fp", time.Second)
	if err != nil || res.State != storage.Done || bytes.Contains(res.Record, store.mark) || !bytes.Contains(res.Record, []byte("applicatioo/json")) {
		t.Fatalf("the store does not hold the tampered record: %+v, %v", res, err)
	}

	for i := range 2 {
		w := send()
		var p struct {
			Type   string `json:"type"`
			Status int    `json:"status"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
			t.Fatalf("retry %d: %d %q is not a problem: %v", i, w.Code, w.Body, err)
		}
		if w.Code != http.StatusInternalServerError || p.Status != http.StatusInternalServerError || !strings.Contains(p.Type, "ErrCorruptRecord") {
			t.Fatalf("retry %d: %d %q, want 500 ErrCorruptRecord", i, w.Code, w.Body)
		}
		if w.Header().Get("Idempotent-Replayed") != "" || strings.Contains(w.Body.String(), "applicatioo") {
			t.Fatalf("retry %d replayed the corrupt record: %v %q", i, w.Header(), w.Body)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}
	var corrupt int
	for _, e := range events {
		if e.Outcome == idem.StoreError && errors.Is(e.Err, idem.ErrCorruptRecord) {
			corrupt++
		}
	}
	if corrupt != 2 {
		t.Fatalf("events %+v, want 2 StoreError events with ErrCorruptRecord", events)
	}
}
