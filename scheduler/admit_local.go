package scheduler

import (
	"context"
	"time"

	"github.com/warden-dev/warden/governor"
	"github.com/warden-dev/warden/governor/pool"
	"github.com/warden-dev/warden/scheduler/store"
)

// localAdmitter admits runs with this sidecar's own gates: lanes,
// worker_max_concurrent, key_concurrency, the definition's pool and its
// named semaphores, all decided under Scheduler.mu without I/O. A freed
// slot admits the next run in the same pass that frees it.
type localAdmitter struct{ s *Scheduler }

// admitLocked admits waiting runs while capacity lasts: each time the best
// head (priority, then age) among definitions whose pool and semaphores
// have room. A definition that cannot admit is skipped for the rest of the
// pass, so it never blocks the others; its pool or the sweeper wakes the
// scheduler when that changes.
func (l localAdmitter) admitLocked(cfg *config, now time.Time) []*active {
	s := l.s
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
			got, control, ok := best.pool.TryAcquire(now)
			if !ok {
				best.skip = s.pass
				if string(control) == ControlPoolRate {
					// Be woken at the window's boundary.
					best.pool.WatchWindow()
				}
				continue
			}
			lease = got
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

// reserveLocked admits a run being submitted when its key, the lanes, its
// semaphores and its pool have room now: it is stored already STARTING.
func (l localAdmitter) reserveLocked(cfg *config, d *definition, key string, prio int32, now time.Time) *active {
	s := l.s
	if limit, _ := cfg.limit(); s.running >= limit {
		return nil
	}
	dq := s.q.def(d.name)
	if dq.keyBusy(key) || !s.semaphoresFree(d) {
		return nil
	}
	var lease pool.Lease
	if d.pool != nil {
		got, _, ok := d.pool.TryAcquire(now)
		if !ok {
			return nil
		}
		lease = got
	}
	a := &active{def: d, q: dq, key: key, prio: prio, queuedAt: now.UnixNano(), admittedAt: now.UnixNano(), lease: lease}
	s.q.resumed(dq, key)
	a.sems = s.acquireSemaphores(d, a)
	s.running++
	s.deliveries.Add(1)
	return a
}

// claim: every local admission is decided under the lock.
func (localAdmitter) claim() {}

func (l localAdmitter) enqueueLocked(r *store.Run) { l.s.pushLocked(r) }

func (localAdmitter) awaitLocked(uint64) *verdict { return nil }

func (localAdmitter) releasedLocked(*active) {}

func (localAdmitter) permitExpiredLocked(*active, string) {}

func (l localAdmitter) leasePermits(a *active, until int64) { l.s.leaseHeldPermits(a, until) }

// controlLocked names the definition's pool when it is full, else the
// lanes or worker_max_concurrent.
func (l localAdmitter) controlLocked(cfg *config, d *definition, now time.Time) string {
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
	return l.s.limitControlLocked(cfg)
}

func (localAdmitter) storeControl(context.Context, string, string, time.Time) (string, bool) {
	return "", false
}

func (localAdmitter) heldElsewhere(string, string) error { return nil }

func (l localAdmitter) queues(now time.Time) []QueueState {
	return l.s.indexQueues(now, func(d *definition) string {
		snap := d.pool.Snapshot(now)
		switch {
		case snap.Concurrency > 0 && snap.InFlight >= snap.Concurrency:
			return ControlPoolConc
		case snap.Rate > 0 && snap.Remaining == 0:
			return ControlPoolRate
		}
		return ""
	})
}

func (l localAdmitter) semaphores(time.Time) []SemaphoreState { return l.s.heldSemaphores() }

func (l localAdmitter) start(ctx context.Context, c *governor.Controls) error {
	return l.s.recover(ctx, c, nil)
}

func (localAdmitter) stop() {}
