package rueidisstore

import (
	"time"

	"github.com/idemkit/idem/storage/internal/redisproto"
)

// PolicyCheckEvery is how long a verdict on the maxmemory-policy stands.
const PolicyCheckEvery = redisproto.CheckEvery

// SetClock makes s read the time from now, for tests that age a verdict
// without waiting. Call it before s is first used.
// It is also the clock that stamps the entries s writes.
func SetClock(s *Store, now func() time.Time) { s.guard.Now, s.now = now, now }

// CheckRunning returns the channel closed when the maxmemory-policy check
// in flight ends, or nil when none is.
func CheckRunning(s *Store) <-chan struct{} { return s.guard.Running() }

// WaitCheck waits for the maxmemory-policy check in flight, if any, to
// end, and reports whether there was one.
func WaitCheck(s *Store) bool {
	done := s.guard.Running()
	if done == nil {
		return false
	}
	<-done
	return true
}

// ScriptsOnly keeps s off the native path (SET IFEQ): an instance of a
// release before it. Call it before s is first used.
func ScriptsOnly(s *Store) *Store { s.native.Off = true; return s }
