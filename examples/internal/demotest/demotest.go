// Package demotest checks an example application with its scripted
// client (the -demo of examples/nethttp, gin and echo), on the memory store
// and on Redis (miniredis), so that the README's demo command keeps
// telling the truth, however often it runs.
package demotest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/idemkit/idem/storage"
	"github.com/idemkit/idem/storage/memstore"
	"github.com/idemkit/idem/storage/redisstore"
	"github.com/redis/go-redis/v9"
)

// Start serves an example's application on store, on a loopback port,
// until the test ends or stop is called, and returns its base URL
// ("http://host:port").
type Start func(t *testing.T, store storage.Store) (base string, stop func())

// Play is an example's scripted client (what its -demo runs): it plays
// against base with the keys of the run id run, writes the transcript to
// out, and returns an error for any answer that is not the promised one.
type Play func(out io.Writer, base, run string) error

// Run serves the application with start and runs play against it; any
// answer other than the promised one fails t. On the memory store the
// client runs twice against one server, as a second run in one process
// does; on Redis two servers, one after the other, each run it once
// against the same Redis, as two runs of `go run ./examples/... -demo
// -redis host:port` do.
func Run(t *testing.T, start Start, play Play) {
	t.Run("memory", func(t *testing.T) {
		store := memstore.New()
		t.Cleanup(func() { store.Close() })
		base, _ := start(t, store)
		for run := range 2 {
			check(t, play, base, run)
		}
	})
	t.Run("redis", func(t *testing.T) {
		mr := miniredis.RunT(t)
		for process := range 2 {
			rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
			base, stop := start(t, redisstore.New(rdb))
			check(t, play, base, 0)
			stop()
			rdb.Close()
			if n, want := len(mr.Keys()), 2*(process+1); n != want {
				t.Errorf("Redis holds %d keys after %d runs, want %d (two keys per run): %v", n, process+1, want, mr.Keys())
			}
		}
	})
}

// check runs play against base with a fresh run id, checks its transcript
// and returns it. run counts the earlier runs against this server: each ran
// the handler twice, so the first order of this run is the handler's run
// 2*run+1 and the double click its run 2*run+2.
func check(t *testing.T, play Play, base string, run int) string {
	t.Helper()
	var out strings.Builder
	var rnd [4]byte
	rand.Read(rnd[:])
	if err := play(&out, base, hex.EncodeToString(rnd[:])); err != nil {
		t.Errorf("run %d: %v\ntranscript:%s", run, err, out.String())
		return out.String()
	}
	got := out.String()
	first, click := fmt.Sprintf(`"handler_runs":%d,`, 2*run+1), fmt.Sprintf(`"handler_runs":%d,`, 2*run+2)
	// handler_runs shows the handler ran once per key.
	if n := strings.Count(got, first); n != 2 {
		t.Errorf("run %d: the first order's response (%s) appears %d times, want 2 (original and replay):%s", run, first, n, got)
	}
	if n := strings.Count(got, `"handler_runs":`); n != 3 || !strings.Contains(got, click) {
		t.Errorf("run %d: want the double click to run the handler exactly once more (%s), and 3 answers with handler_runs:%s", run, click, got)
	}
	return got
}

// READMERun is the run id of the README's transcript: its keys are
// order-1-READMERun and order-2-READMERun.
const READMERun = "7d3f09a2"

// CheckREADME runs play on the memory store with the keys of the
// README's transcript and requires, byte for byte, the transcript the
// README shows after "The transcript shows", with the server's address
// written as the README writes it (localhost:8080).
func CheckREADME(t *testing.T, start Start, play Play) {
	t.Helper()
	md, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	want, ok := transcript(string(md))
	if !ok {
		t.Fatal("README.md: no ```text block after \"The transcript shows\"")
	}
	store := memstore.New()
	t.Cleanup(func() { store.Close() })
	base, _ := start(t, store)
	var out strings.Builder
	if err := play(&out, base, READMERun); err != nil {
		t.Fatalf("the demo client: %v\n%s", err, out.String())
	}
	got := strings.TrimSpace(strings.ReplaceAll(out.String(), base, "localhost:8080"))
	if got != want {
		t.Errorf("the README's transcript is not what the demo prints.\nREADME.md:\n%s\n\nthe demo:\n%s", want, got)
	}
}

// transcript returns the first ```text block of md after the sentence
// that introduces the demo's transcript.
func transcript(md string) (string, bool) {
	_, rest, ok := strings.Cut(md, "The transcript shows")
	if !ok {
		return "", false
	}
	_, rest, ok = strings.Cut(rest, "```text\n")
	if !ok {
		return "", false
	}
	block, _, ok := strings.Cut(rest, "```")
	return strings.TrimSpace(block), ok
}

// Buffer is an output (a server's log, a program's transcript) that one
// goroutine writes while the test may read it.
type Buffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns what was written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
