package httprec

import (
	"net/http"
	"testing"
)

var benchRecord = Record{
	Status: 201,
	Header: http.Header{
		"Content-Type":  {"application/json"},
		"Location":      {"/orders/42"},
		"Cache-Control": {"no-store"},
		"X-Request-Id":  {"2f1c7a9e-6f7d-4a8e-9f55-0d3c1b2a4e6f"},
		"Vary":          {"Accept-Encoding", "Authorization"},
	},
	Body: jsonBody,
}

// jsonBody is a 200-byte JSON document.
var jsonBody = []byte(`{"id":42,"status":"created","customer":"c_8d2f","items":[{"sku":"A-1","qty":2},{"sku":"B-7","qty":1}],"total":{"amount":"129.90","currency":"EUR"},"created_at":"2026-11-22T20:20:00Z","note":"leave at door"}`)

func BenchmarkAppendBinary(b *testing.B) {
	buf := make([]byte, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		buf, _ = benchRecord.AppendBinary(buf[:0])
	}
	b.SetBytes(int64(len(buf)))
}

func BenchmarkMarshalBinary(b *testing.B) {
	b.ReportAllocs()
	var data []byte
	for b.Loop() {
		data, _ = benchRecord.MarshalBinary()
	}
	b.SetBytes(int64(len(data)))
}

func BenchmarkUnmarshal(b *testing.B) {
	data, err := benchRecord.MarshalBinary()
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	var rec Record
	for b.Loop() {
		if err := rec.UnmarshalBinary(data); err != nil {
			b.Fatal(err)
		}
	}
}

// discardWriter is a ResponseWriter that throws everything away.
type discardWriter struct{ h http.Header }

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) WriteHeader(int)             {}
func (d *discardWriter) Write(p []byte) (int, error) { return len(p), nil }

// BenchmarkReplayBinary replays the encoded benchRecord into a writer
// whose header map is cleared each time.
func BenchmarkReplayBinary(b *testing.B) {
	data, err := benchRecord.MarshalBinary()
	if err != nil {
		b.Fatal(err)
	}
	w := &discardWriter{h: make(http.Header)}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		clear(w.h)
		if _, err := ReplayBinary(w, data); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCapture writes a 200-byte JSON response through a Capture and
// takes its record: "new" allocates a Capture per response, "reset" reuses
// one as a sync.Pool would.
func BenchmarkCapture(b *testing.B) {
	respond := func(c *Capture) {
		c.Header().Set("Content-Type", "application/json")
		c.WriteHeader(http.StatusCreated)
		c.Write(jsonBody)
		c.Finish()
		if rec, ok := c.Record(); !ok || len(rec.Body) != len(jsonBody) {
			b.Fatal("not captured")
		}
	}
	b.Run("new", func(b *testing.B) {
		w := &discardWriter{h: make(http.Header)}
		b.ReportAllocs()
		for b.Loop() {
			clear(w.h)
			respond(NewCapture(w, 1<<20, nil))
		}
	})
	b.Run("reset", func(b *testing.B) {
		w := &discardWriter{h: make(http.Header)}
		c := NewCapture(w, 1<<20, nil)
		b.ReportAllocs()
		for b.Loop() {
			clear(w.h)
			c.Reset(w, 1<<20, nil)
			respond(c)
		}
	})
	b.Run("sniffed", func(b *testing.B) {
		w := &discardWriter{h: make(http.Header)}
		c := NewCapture(w, 1<<20, nil)
		b.ReportAllocs()
		for b.Loop() {
			clear(w.h)
			c.Reset(w, 1<<20, nil)
			c.Write(jsonBody)
			c.Finish()
			c.Record()
		}
	})
}
