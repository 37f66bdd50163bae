package redisstore

import "time"

// PolicyCheckEvery is how long a verdict on the maxmemory-policy stands.
const PolicyCheckEvery = policyCheckEvery

// SetClock makes s read the time from now, for tests that age a verdict
// without waiting. Call it before s is first used.
func SetClock(s *Store, now func() time.Time) { s.now = now }

// CheckRunning returns the channel closed when the maxmemory-policy check
// in flight ends, or nil when none is.
func CheckRunning(s *Store) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.running
}

// WaitCheck waits for the maxmemory-policy check in flight, if any, to
// end, and reports whether there was one.
func WaitCheck(s *Store) bool {
	s.mu.Lock()
	done := s.running
	s.mu.Unlock()
	if done == nil {
		return false
	}
	<-done
	return true
}
