package scheduler

import (
	"context"
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
	seq         uint64
	run         store.Run   // as last written (full once loaded)
	def         *definition // settings it was admitted under; nil if unknown
	q           *defQueue
	key         string
	prio        int32
	queuedAt    int64
	admittedAt  int64
	lease       pool.Lease
	sems        []string
	phase       phase
	done        bool // ended, or left for RETRY_WAIT: nobody else may move it
	heartbeatAt int64
	timer       clock.Timer // start_to_close / heartbeat
	cancel      context.CancelFunc
}

// admitLocked admits waiting runs while capacity lasts: each time the best
// head (priority, then age) among definitions whose pool and semaphores
// have room. A definition that cannot admit is skipped for the rest of the
// pass, so it never blocks the others; its pool or the sweeper wakes the
// scheduler when that changes. The returned runs are to be launched
// outside the lock.
func (s *Scheduler) admitLocked(now time.Time) []*active {
	cfg := s.cfgPtr.Load()
	if cfg == nil || s.draining || s.closed {
		return nil
	}
	limit, _ := cfg.limit()
	s.pass++
	var out []*active
	for s.running < limit {
		var best *definition
		var top item
		for _, d := range cfg.order {
			if d.skip == s.pass {
				continue
			}
			dq := s.q.defs[d.name]
			if dq == nil {
				continue
			}
			it, ok := s.q.head(dq)
			if ok && (best == nil || it.before(top)) {
				best, top = d, it
			}
		}
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
				if control == pool.ControlRate {
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
		a.sems = s.acquireSemaphores(best, e.seq)
		s.running++
		s.active[e.seq] = a
		s.deliveries.Add(1)
		out = append(out, a)
		if s.m != nil {
			s.m.RunQueueWait.WithLabelValues(best.name).Observe(time.Duration(a.admittedAt - e.queuedAt).Seconds())
		}
	}
	return out
}

// launch starts the delivery of admitted runs.
func (s *Scheduler) launch(started []*active) {
	for _, a := range started {
		go s.deliverRun(a)
	}
}

// releaseLocked frees everything an admitted run holds.
func (s *Scheduler) releaseLocked(a *active) {
	if _, ok := s.active[a.seq]; !ok {
		return
	}
	delete(s.active, a.seq)
	s.running--
	s.q.finished(a.q, a.key)
	s.releaseSemaphores(a.sems, a.seq)
	a.lease.Release()
	if a.timer != nil {
		a.timer.Stop()
	}
	if a.cancel != nil {
		a.cancel()
	}
}

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
	if d.pool != nil {
		p := d.pool.Snapshot(now)
		if p.Concurrency > 0 && p.InFlight >= p.Concurrency {
			return ControlPoolConc
		}
		if p.Rate > 0 && p.Remaining == 0 {
			return ControlPoolRate
		}
		if p.Queued > 0 {
			return pool.ControlQueue
		}
	}
	limit, control := cfg.limit()
	if s.running >= limit {
		return control
	}
	return ControlLanes
}
