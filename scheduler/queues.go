package scheduler

import (
	"slices"
	"strings"
	"time"
)

// QueueState is one row of GET /v1/queues: the waiting runs of a
// definition, of one key of a definition, or of a pool (across the
// definitions that use it), with the control holding them.
type QueueState struct {
	Scope            string  `json:"scope"` // definition | key | pool
	Definition       string  `json:"definition,omitempty"`
	Key              *string `json:"key,omitempty"`
	Pool             string  `json:"pool,omitempty"`
	Depth            int     `json:"depth"`
	OldestAgeSeconds float64 `json:"oldest_age_seconds"`
	Running          int     `json:"running"`
	Control          string  `json:"control,omitempty"`
}

// maxKeyRows bounds the key rows per definition (the deepest first): a
// definition may have millions of keys.
const maxKeyRows = 100

// Queues reports queue depth and the age of the oldest waiting run per
// definition, per key and per pool, for GET /v1/queues ("why is my run not
// running?"). It walks the index once: O(waiting runs).
func (s *Scheduler) Queues() any {
	now := s.clk.Now()
	s.mu.Lock()
	started, sh := s.started, s.shared
	s.mu.Unlock()
	if !started {
		return []QueueState{}
	}
	if sh != nil {
		return s.sharedQueues(now)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []QueueState{}
	if !s.started {
		return out
	}
	cfg := s.cfgPtr.Load()
	type agg struct {
		depth   int
		oldest  int64
		running int
	}
	groups := map[*group]*agg{}
	for i := range s.q.slab {
		e := &s.q.slab[i]
		if e.g == nil {
			continue
		}
		a := groups[e.g]
		if a == nil {
			a = &agg{oldest: e.queuedAt}
			groups[e.g] = a
		}
		a.depth++
		a.oldest = min(a.oldest, e.queuedAt)
	}
	age := func(oldest int64) float64 {
		if oldest == 0 {
			return 0
		}
		return time.Duration(now.UnixNano() - oldest).Seconds()
	}
	pools := map[string]*agg{}
	poolByID := map[string]*definition{}
	names := make([]string, 0, len(s.q.defs))
	for name := range s.q.defs {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		dq := s.q.defs[name]
		def := agg{}
		var keys []QueueState
		for _, g := range dq.groups {
			a := groups[g]
			if a == nil {
				a = &agg{}
			}
			def.depth += a.depth
			def.running += g.running
			if a.depth > 0 && (def.oldest == 0 || a.oldest < def.oldest) {
				def.oldest = a.oldest
			}
			if dq.keyLimit > 0 {
				row := QueueState{Scope: "key", Definition: name, Key: &g.key, Depth: a.depth,
					OldestAgeSeconds: age(a.oldest), Running: g.running}
				if a.depth > 0 {
					row.Control = s.controlLocked(dq, g.key, now)
				}
				keys = append(keys, row)
			}
		}
		if def.depth == 0 && def.running == 0 && (cfg == nil || cfg.defs[name] == nil) {
			continue
		}
		row := QueueState{Scope: "definition", Definition: name, Depth: def.depth, OldestAgeSeconds: age(def.oldest), Running: def.running}
		if it, ok := s.q.head(dq); ok {
			row.Control = s.controlLocked(dq, s.q.slab[it.h].g.key, now)
		} else if def.depth > 0 {
			row.Control = ControlKey // every waiting key is at its key_concurrency
		}
		if cfg != nil && cfg.defs[name] == nil && def.depth > 0 {
			row.Control = ControlDefinition
		}
		out = append(out, row)
		slices.SortFunc(keys, func(a, b QueueState) int {
			if a.Depth != b.Depth {
				return b.Depth - a.Depth
			}
			return strings.Compare(*a.Key, *b.Key)
		})
		if len(keys) > maxKeyRows {
			keys = keys[:maxKeyRows]
		}
		out = append(out, keys...)
		if cfg != nil {
			if d := cfg.defs[name]; d != nil && d.pool != nil {
				p := pools[d.pool.ID()]
				if p == nil {
					p = &agg{}
					pools[d.pool.ID()] = p
					poolByID[d.pool.ID()] = d
				}
				p.depth += def.depth
				p.running += def.running
				if def.depth > 0 && (p.oldest == 0 || def.oldest < p.oldest) {
					p.oldest = def.oldest
				}
			}
		}
	}
	ids := make([]string, 0, len(pools))
	for id := range pools {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		p := pools[id]
		row := QueueState{Scope: "pool", Pool: id, Depth: p.depth, OldestAgeSeconds: age(p.oldest), Running: p.running}
		if p.depth > 0 && s.rg != nil {
			// What the last shared admissions found: no round trip
			// under the lock.
			row.Control = s.rg.poolNotes[id]
		} else if p.depth > 0 {
			snap := poolByID[id].pool.Snapshot(now)
			switch {
			case snap.Concurrency > 0 && snap.InFlight >= snap.Concurrency:
				row.Control = ControlPoolConc
			case snap.Rate > 0 && snap.Remaining == 0:
				row.Control = ControlPoolRate
			}
		}
		out = append(out, row)
	}
	return out
}
