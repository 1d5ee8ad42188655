package pool

import (
	"sort"
	"time"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/metrics"
	"github.com/warden-dev/warden/governor/window"
	"github.com/warden-dev/warden/policy"
)

// Set is every pool of one policy, by member name and by ID.
type Set struct {
	byName map[string]*Pool
	byID   map[string]*Pool
	ids    []string
	c      window.Counter
	clk    clock.Clock
	m      *metrics.Metrics
}

// NewSet builds the pools of a policy. Members sharing a cap_key get one
// Pool with the settings of the first member in file order (the policy
// loader warns about members that differ).
func NewSet(pools []policy.Pool, c window.Counter, clk clock.Clock, m *metrics.Metrics) *Set {
	return (&Set{c: c, clk: clk, m: m}).Rebuild(pools)
}

// Rebuild returns the set for a reloaded policy. A pool whose ID survives
// keeps its state (in-flight count, queue, window); new settings apply to it
// at once. A pool that disappears keeps serving the leases it granted.
func (s *Set) Rebuild(pools []policy.Pool) *Set {
	n := &Set{byName: map[string]*Pool{}, byID: map[string]*Pool{}, c: s.c, clk: s.clk, m: s.m}
	for _, cfg := range pools {
		id := cfg.ID()
		p, ok := n.byID[id]
		if !ok {
			if old := s.byID[id]; old != nil {
				p = old
				p.update(cfg)
			} else {
				p = newPool(cfg, s.c, s.clk, s.m)
			}
			n.byID[id] = p
			n.ids = append(n.ids, id)
		}
		n.byName[cfg.Name] = p
	}
	sort.Strings(n.ids)
	if s.m != nil {
		for id := range s.byID {
			if _, kept := n.byID[id]; !kept {
				s.m.PoolInFlight.DeleteLabelValues(id)
				s.m.PoolQueued.DeleteLabelValues(id)
				s.m.PoolWindowCount.DeleteLabelValues(id)
			}
		}
	}
	return n
}

// Get returns the pool a policy name refers to.
func (s *Set) Get(name string) *Pool { return s.byName[name] }

// ByID returns the pool with counter identity id (name or cap:KEY).
func (s *Set) ByID(id string) *Pool { return s.byID[id] }

// Snapshots lists every pool's state, ordered by ID.
func (s *Set) Snapshots(now time.Time) []Snapshot {
	out := make([]Snapshot, 0, len(s.ids))
	for _, id := range s.ids {
		out = append(out, s.byID[id].Snapshot(now))
	}
	return out
}

// RefreshCounts sets every pool's warden_pool_window_count to its current
// window's count.
func (s *Set) RefreshCounts() {
	for _, id := range s.ids {
		s.byID[id].refreshCount()
	}
}

// ResetAll restores every pool's full rate allowance.
func (s *Set) ResetAll() {
	for _, id := range s.ids {
		s.byID[id].Reset()
	}
}
