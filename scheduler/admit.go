package scheduler

import (
	"sync"
	"time"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/pool"
	"github.com/warden-dev/warden/scheduler/store"
)

type phase uint8

const (
	phaseAdmitted   phase = iota // admitted; its STARTING record is being written
	phaseDelivering              // the request to the worker is in flight
	phaseAsync                   // the worker answered 202 and owns the run
)

// active is an admitted run: it holds a lane, its key's slot, its
// semaphore permits and its pool lease until it ends or waits to retry.
type active struct {
	// Set at admission, read-only after.
	seq        uint64
	def        *definition // settings it was admitted under; nil if unknown
	q          *defQueue
	key        string
	prio       int32
	queuedAt   int64
	admittedAt int64

	// Guarded by Scheduler.mu.
	lease    pool.Lease
	sems     []string
	released bool
	red      *redisHeld // its leases in Redis when lanes are shared (redisgates.go)

	// Guarded by mu, a leaf lock: nothing else is locked while it is held,
	// so a run's own transitions never wait for the admission lock.
	mu          sync.Mutex
	run         store.Run // as last written (full once loaded)
	phase       phase
	done        bool // ended, or left for RETRY_WAIT: nobody else may move it
	heartbeatAt int64
	timer       clock.Timer // start_to_close / heartbeat

	ctx abort // the delivery's context, with its own lock
}

// end marks the run as leaving its admission; false when another
// transition got there first. It returns the run as last written.
func (a *active) end() (store.Run, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.done {
		return store.Run{}, false
	}
	a.done = true
	if a.timer != nil {
		a.timer.Stop()
	}
	a.ctx.cancel()
	return a.run, true
}

func (a *active) getPhase() phase {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.phase
}

// admitLocked admits waiting runs while capacity lasts: each time the best
// head (priority, then age) among definitions whose pool and semaphores
// have room. A definition that cannot admit is skipped for the rest of the
// pass, so it never blocks the others; its pool or the sweeper wakes the
// scheduler when that changes. The returned runs are to be launched
// outside the lock.
func (s *Scheduler) admitLocked(now time.Time) []*active {
	cfg := s.cfgPtr.Load()
	if cfg == nil || s.draining || s.closed || s.recovering || s.shared != nil {
		return nil // a shared store admits through claims (shared.go)
	}
	if s.rg != nil {
		// Lanes shared through Redis: admitted by a pass outside the lock.
		s.pokeRedisLocked(true)
		return nil
	}
	limit, _ := cfg.limit()
	s.pass++
	var out []*active
	for s.running < limit {
		best, top := s.bestHeadLocked(cfg)
		if best == nil {
			break
		}
		if !s.semaphoresFree(best) {
			best.skip = s.pass
			continue
		}
		var lease pool.Lease
		if best.pool != nil {
			l, control, ok := best.pool.TryAcquire(now)
			if !ok {
				best.skip = s.pass
				if string(control) == ControlPoolRate {
					// Be woken at the window's boundary.
					best.pool.WatchWindow()
				}
				continue
			}
			lease = l
		}
		dq := s.q.defs[best.name]
		e := s.q.admit(dq)
		a := &active{
			seq: e.seq, def: best, q: dq, key: e.g.key, prio: top.prio, queuedAt: e.queuedAt,
			admittedAt: now.UnixNano(), lease: lease,
		}
		a.sems = s.acquireSemaphores(best, a)
		s.running++
		s.active[e.seq] = a
		s.deliveries.Add(1)
		out = append(out, a)
		if best.waitObs != nil {
			best.waitObs.Observe(time.Duration(a.admittedAt - e.queuedAt).Seconds())
		}
	}
	return out
}

// bestHeadLocked is the waiting run to admit next: the best head
// (priority, then age) among the definitions not skipped in this pass;
// best is nil when there is none.
func (s *Scheduler) bestHeadLocked(cfg *config) (best *definition, top item) {
	for _, d := range cfg.order {
		if d.skip == s.pass {
			continue
		}
		dq := s.q.defs[d.name]
		if dq == nil {
			continue
		}
		if it, ok := s.q.head(dq); ok && (best == nil || it.before(top)) {
			best, top = d, it
		}
	}
	return best, top
}

// reserveLocked admits a run that is being submitted, before it has an id,
// when every gate has room for it now; nil when it must wait.
func (s *Scheduler) reserveLocked(d *definition, key string, prio int32, now time.Time) *active {
	cfg := s.cfgPtr.Load()
	if cfg == nil || s.draining || s.closed || s.shared != nil || s.rg != nil {
		return nil
	}
	if limit, _ := cfg.limit(); s.running >= limit {
		return nil
	}
	dq := s.q.def(d.name)
	if dq.keyBusy(key) || !s.semaphoresFree(d) {
		return nil
	}
	var lease pool.Lease
	if d.pool != nil {
		l, _, ok := d.pool.TryAcquire(now)
		if !ok {
			return nil
		}
		lease = l
	}
	a := &active{def: d, q: dq, key: key, prio: prio, queuedAt: now.UnixNano(), admittedAt: now.UnixNano(), lease: lease}
	s.q.resumed(dq, key)
	a.sems = s.acquireSemaphores(d, a)
	s.running++
	s.deliveries.Add(1)
	return a
}

// unreserve gives back a reservation whose run was not stored (an error,
// or its idempotency key named an existing run): it never started.
func (s *Scheduler) unreserve(a *active) {
	a.lease.Refund()
	now := s.clk.Now()
	s.mu.Lock()
	s.releaseLocked(a)
	started := s.admitLocked(now)
	s.mu.Unlock()
	s.launch(started)
	s.deliveries.Done()
}

// launch starts the delivery of admitted runs.
func (s *Scheduler) launch(started []*active) {
	for _, a := range started {
		go s.deliverRun(a)
	}
}

// releaseLocked frees everything an admitted run holds.
func (s *Scheduler) releaseLocked(a *active) {
	if a.released {
		return
	}
	a.released = true
	if s.active[a.seq] == a {
		// A retry may have admitted the run again before this release.
		delete(s.active, a.seq)
	}
	s.running--
	s.q.finished(a.q, a.key)
	s.releaseSemaphores(a.sems, a)
	a.lease.Release()
	if a.red != nil {
		s.dropRedisLocked(a)
	}
}

// free hands an ended run to the admission loop, which releases what it
// held and admits the next runs. Completions arrive from many goroutines;
// the loop folds those waiting into one pass under one lock, so the
// admission lock is taken once per batch rather than once per run.
func (s *Scheduler) free(a *active) { s.freed <- a }

// controlLocked names the control holding a waiting run of dq with key: the
// run's own gates first (its key, its semaphores, its pool), then the shared
// ones (worker_max_concurrent, lanes). A run all of whose gates are open is
// waiting for its turn in the lanes.
func (s *Scheduler) controlLocked(dq *defQueue, key string, now time.Time) string {
	cfg := s.cfgPtr.Load()
	if cfg == nil {
		return ControlLanes
	}
	d := cfg.defs[dq.name]
	if d == nil {
		return ControlDefinition
	}
	if dq.keyBusy(key) {
		return ControlKey
	}
	if !s.semaphoresFree(d) {
		return ControlSemaphore
	}
	if s.rg != nil {
		return s.redisControlLocked(cfg, d) // no round trip under the lock
	}
	if s.shared != nil {
		// The shared store's gates hold the run; callers read them from the
		// store outside the lock (sharedControl). A shared pool's snapshot
		// would be a Redis round trip under the lock.
		return ControlLanes
	}
	if d.pool != nil {
		p := d.pool.Snapshot(now)
		if p.Concurrency > 0 && p.InFlight >= p.Concurrency {
			return ControlPoolConc
		}
		if p.Rate > 0 && p.Remaining == 0 {
			return ControlPoolRate
		}
		if p.Queued > 0 {
			return ControlPoolQueue
		}
	}
	limit, control := cfg.limit()
	if s.running >= limit {
		return control
	}
	return ControlLanes
}
