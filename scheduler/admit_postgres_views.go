package scheduler

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/warden-dev/warden/scheduler/store/pgstore"
)

// What the postgres admitter (admit_postgres.go) shows: queues, semaphores
// and the control holding a waiting run, read from the shared store.

// queues is GET /v1/queues read from the shared store: every
// sidecar's waiting and admitted runs, and the control holding each
// definition's and key's next run, as the shared gates read now (a view:
// only a claim decides).
func (pg *postgresAdmitter) queues(now time.Time) []QueueState {
	s := pg.s
	out := []QueueState{}
	cfg := s.cfgPtr.Load()
	var keyed []string
	if cfg != nil {
		for _, d := range cfg.order {
			if d.key != nil && d.cfg.KeyConcurrency > 0 {
				keyed = append(keyed, d.name)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), sharedCallTimeout)
	defer cancel()
	defs, keys, err := pg.st.QueueStats(ctx, keyed)
	if err != nil {
		s.log.Error("read queue state", "err", err)
		return out
	}
	age := func(oldest int64) float64 {
		if oldest == 0 {
			return 0
		}
		return time.Duration(now.UnixNano() - oldest).Seconds()
	}
	type agg struct {
		depth, running int
		oldest         int64
	}
	pools := map[string]*agg{}
	var poolIDs []string
	ki := 0
	for _, g := range defs {
		row := QueueState{Scope: "definition", Definition: g.Name, Depth: g.Depth, OldestAgeSeconds: age(g.Oldest), Running: g.Admitted}
		var keyRows []QueueState
		// The definition's next run is the oldest waiting one whose key
		// has room (its key row's control is the row's); when every
		// waiting key is full, the key holds it.
		var next *pgstore.GroupStat
		var nextControl string
		for ; ki < len(keys) && keys[ki].Name <= g.Name; ki++ {
			if keys[ki].Name != g.Name {
				continue
			}
			k := keys[ki]
			kr := QueueState{Scope: "key", Definition: g.Name, Key: &k.Key, Depth: k.Depth,
				OldestAgeSeconds: age(k.Oldest), Running: k.Admitted}
			if k.Depth > 0 && cfg != nil && cfg.defs[g.Name] != nil {
				kr.Control = pg.control(ctx, g.Name, k.Key, now)
				if kr.Control != ControlKey && (next == nil || k.Oldest < next.Oldest) {
					next, nextControl = &keys[ki], kr.Control
				}
			}
			keyRows = append(keyRows, kr)
		}
		switch {
		case g.Depth == 0, cfg == nil:
		case cfg.defs[g.Name] == nil:
			row.Control = ControlDefinition
		case len(keyRows) == 0:
			row.Control = pg.control(ctx, g.Name, "", now)
		case next == nil:
			row.Control = ControlKey
		default:
			row.Control = nextControl
		}
		out = append(out, row)
		out = append(out, keyRows...)
		if cfg != nil {
			if d := cfg.defs[g.Name]; d != nil && d.pool != nil {
				p := pools[d.pool.ID()]
				if p == nil {
					p = &agg{}
					pools[d.pool.ID()] = p
					poolIDs = append(poolIDs, d.pool.ID())
				}
				p.depth += g.Depth
				p.running += g.Admitted
				if g.Depth > 0 && (p.oldest == 0 || g.Oldest < p.oldest) {
					p.oldest = g.Oldest
				}
			}
		}
	}
	slices.Sort(poolIDs)
	for _, id := range poolIDs {
		p := pools[id]
		out = append(out, QueueState{Scope: "pool", Pool: id, Depth: p.depth, OldestAgeSeconds: age(p.oldest), Running: p.running})
	}
	return out
}

// semaphores is GET /v1/semaphores with the permits held across
// every sidecar.
func (pg *postgresAdmitter) semaphores(now time.Time) []SemaphoreState {
	s := pg.s
	cfg := s.cfgPtr.Load()
	out := []SemaphoreState{}
	if cfg == nil {
		return out
	}
	ctx, cancel := context.WithTimeout(context.Background(), sharedCallTimeout)
	defer cancel()
	held, err := pg.st.PermitsHeld(ctx, now.UnixNano())
	if err != nil {
		s.log.Error("read semaphore permits", "err", err)
	}
	for name, permits := range cfg.semaphores {
		out = append(out, SemaphoreState{Name: name, Permits: permits, Held: held[name]})
	}
	slices.SortFunc(out, func(a, b SemaphoreState) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// control names the control holding a waiting run in the shared
// queue, in the order the in-process admitter names them: the run's own
// gates (key, semaphores, pool), then the shared ones; "" when no gate is
// full (the run waits only for a claim loop, or behind runs that will take
// the lanes left).
func (pg *postgresAdmitter) control(ctx context.Context, name, key string, now time.Time) string {
	s := pg.s
	cfg := s.cfgPtr.Load()
	if cfg == nil {
		return ControlLanes
	}
	if cfg.defs[name] == nil {
		return ControlDefinition
	}
	ctx, cancel := context.WithTimeout(ctx, sharedCallTimeout)
	defer cancel()
	h, err := pg.st.Holding(ctx, pg.claimRequest(cfg, now), name, key)
	switch {
	case err != nil:
		s.log.Error("read the gates holding a run", "definition", name, "err", err)
		return ControlLanes
	case h.Key:
		return ControlKey
	case h.Semaphore:
		return ControlSemaphore
	case h.PoolConcurrency:
		return ControlPoolConc
	case h.PoolRate:
		return ControlPoolRate
	case h.Worker && !h.Lanes:
		return ControlWorker
	case h.Lanes:
		return ControlLanes
	}
	// No gate is full: the run only waits for a claim loop to take it, a
	// moment away, and naming a gate would send the reader (and the
	// rejection metric) after one that holds nothing (SPEC §4).
	return ""
}

// storeControl: a waiting run is held by the shared queue's gates, not by
// this sidecar's index.
func (pg *postgresAdmitter) storeControl(ctx context.Context, name, key string, now time.Time) (string, bool) {
	return pg.control(ctx, name, key, now), true
}

// controlLocked: the shared store's gates hold the run; callers read them
// from the store outside the lock (storeControl). A shared pool's snapshot
// would be a Redis round trip under the lock.
func (*postgresAdmitter) controlLocked(*config, *definition, time.Time) string { return ControlLanes }
