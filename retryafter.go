package idem

import (
	"slices"
	"sync"
	"time"
)

// The Retry-After of a 409 (a duplicate of a request still in flight) is
// an estimate of when that request will be done: a high percentile of how
// long the route's handler took on its last runs in this process, at least
// one second (the header's unit) and at most the lease the first request
// has left (by then it has finished or its process has died). A route this
// process has not run yet gets one second.

const (
	// recentRuns is how many of a route's last handler durations are kept.
	recentRuns = 32
	// maxTimedRoutes bounds the routes timed separately; the routes beyond
	// it (possible only when the route is the URL path, around a handler
	// that is not a mux) share one record.
	maxTimedRoutes = 1024
	// runPercentile is the percentile of the recent durations used.
	runPercentile = 90
)

// runTimes keeps the recent handler durations of each route.
type runTimes struct {
	mu     sync.RWMutex
	routes map[string]*recentTimes
	other  recentTimes // the routes past maxTimedRoutes
}

// recentTimes is a ring of one route's last durations.
type recentTimes struct {
	mu    sync.Mutex
	d     [recentRuns]time.Duration
	n     int           // durations observed so far
	est   time.Duration // the runPercentile of d, unless stale
	stale bool          // a duration was observed since est was computed
}

// of returns the record of route, made on first use.
func (rt *runTimes) of(route string) *recentTimes {
	rt.mu.RLock()
	r := rt.routes[route]
	rt.mu.RUnlock()
	if r != nil {
		return r
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if r = rt.routes[route]; r != nil {
		return r
	}
	if len(rt.routes) >= maxTimedRoutes {
		return &rt.other
	}
	if rt.routes == nil {
		rt.routes = make(map[string]*recentTimes)
	}
	r = new(recentTimes)
	rt.routes[route] = r
	return r
}

// observe records that route's handler ran for d.
func (rt *runTimes) observe(route string, d time.Duration) {
	r := rt.of(route)
	r.mu.Lock()
	r.d[r.n%recentRuns] = d
	r.n++
	r.stale = true
	r.mu.Unlock()
}

// retryAfter estimates when a request in flight on route will be done, for
// a 409's Retry-After: the runPercentile of the route's recent durations,
// at least a second, at most leaseLeft (when that is over a second).
func (rt *runTimes) retryAfter(route string, leaseLeft time.Duration) time.Duration {
	est := time.Second
	r := rt.of(route)
	r.mu.Lock()
	if k := min(r.n, recentRuns); k > 0 {
		if r.stale { // sorted once per burst of conflicts, not per 409
			d := r.d
			s := d[:k]
			slices.Sort(s)
			r.est, r.stale = s[(k*runPercentile+99)/100-1], false
		}
		est = r.est
	}
	r.mu.Unlock()
	return max(min(est, leaseLeft), time.Second)
}
