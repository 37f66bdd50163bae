package idemadmin

import (
	"context"
	"time"

	"github.com/idemkit/idem/storage"
)

// Stats counts what a store holds.
type Stats struct {
	// Entries counts the live entries by state (StateName's words).
	Entries map[string]int `json:"entries"`
	// OldestInFlight is the in-flight entry whose Since is the oldest;
	// nil when none is in flight (or none tells its Since).
	OldestInFlight *Entry `json:"oldest_in_flight,omitempty"`
}

// Count reads every entry of store, a page of [storage.MaxListLimit] at a
// time, and counts them: on a store of millions of entries it takes as
// many calls as pages (each bounded), so run it from an operator's tool,
// not on a request path. An entry a listing shows twice (a Redis SCAN
// may) is counted twice.
func Count(ctx context.Context, store storage.Inspector) (Stats, error) {
	s := Stats{Entries: map[string]int{"in_flight": 0, "done": 0, "committed": 0, "issued": 0}}
	var oldest storage.Entry
	q := storage.Query{Limit: storage.MaxListLimit}
	for {
		page, err := store.List(ctx, q)
		if err != nil {
			return Stats{}, err
		}
		for _, e := range page.Entries {
			s.Entries[StateName(e.State)]++
			if e.State == storage.InFlight && !e.Since.IsZero() && (oldest.Since.IsZero() || e.Since.Before(oldest.Since)) {
				oldest = e
			}
		}
		if page.Next == "" {
			break
		}
		q.Cursor = page.Next
	}
	if !oldest.Since.IsZero() {
		v := View(oldest, time.Now())
		s.OldestInFlight = &v
	}
	return s, nil
}
