package scheduler

import (
	"slices"
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
// definition may have millions of keys, one per value a client sent.
const maxKeyRows = 100

// Queues reports queue depth and the age of the oldest waiting run per
// definition, per key and per pool, for GET /v1/queues ("why is my run not
// running?"). It walks each group's waiting runs once: O(waiting runs) in
// time, and memory in the rows it answers (definitions and pools, and at
// most maxKeyRows keys of each definition), not in the keys.
func (s *Scheduler) Queues() []QueueState {
	now := s.clk.Now()
	s.mu.Lock()
	started, adm := s.started, s.adm
	s.mu.Unlock()
	if !started {
		return []QueueState{}
	}
	return adm.queues(now)
}

// indexQueues is Queues read from this sidecar's index (the local and
// Redis admitters); poolControl names the control of a pool row with
// waiting runs, d being a definition that uses the pool.
func (s *Scheduler) indexQueues(now time.Time, poolControl func(d *definition) string) []QueueState {
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
		keys := deepestKeys{}
		for _, g := range dq.groups {
			oldest := s.q.queuedFirst(g)
			def.depth += g.live
			def.running += g.running
			if g.live > 0 && (def.oldest == 0 || oldest < def.oldest) {
				def.oldest = oldest
			}
			if dq.keyLimit > 0 {
				keys.add(g)
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
		for _, g := range keys.sorted() {
			kr := QueueState{Scope: "key", Definition: name, Key: &g.key, Depth: g.live,
				OldestAgeSeconds: age(s.q.queuedFirst(g)), Running: g.running}
			if g.live > 0 {
				kr.Control = s.controlLocked(dq, g.key, now)
			}
			out = append(out, kr)
		}
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
		if p.depth > 0 {
			row.Control = poolControl(poolByID[id])
		}
		out = append(out, row)
	}
	return out
}

// deepestKeys keeps the maxKeyRows groups of a definition that come first
// in /v1/queues's order (deepest, then by key), one group at a time: a
// heap whose top is the group to drop when a better one comes.
type deepestKeys []*group

// keyBefore orders key rows: the deepest first, then by key.
func keyBefore(a, b *group) bool {
	if a.live != b.live {
		return a.live > b.live
	}
	return a.key < b.key
}

func (k *deepestKeys) add(g *group) {
	h := *k
	switch {
	case len(h) < maxKeyRows:
		h = append(h, g)
		for i := len(h) - 1; i > 0 && keyBefore(h[(i-1)/2], h[i]); i = (i - 1) / 2 {
			h[i], h[(i-1)/2] = h[(i-1)/2], h[i]
		}
	case keyBefore(g, h[0]):
		h[0] = g
		for i := 0; ; {
			worst, l, r := i, 2*i+1, 2*i+2
			if l < len(h) && keyBefore(h[worst], h[l]) {
				worst = l
			}
			if r < len(h) && keyBefore(h[worst], h[r]) {
				worst = r
			}
			if worst == i {
				break
			}
			h[i], h[worst] = h[worst], h[i]
			i = worst
		}
	}
	*k = h
}

// sorted returns the groups kept, in row order.
func (k deepestKeys) sorted() []*group {
	slices.SortFunc(k, func(a, b *group) int {
		if keyBefore(a, b) {
			return -1
		}
		if keyBefore(b, a) {
			return 1
		}
		return 0
	})
	return k
}
