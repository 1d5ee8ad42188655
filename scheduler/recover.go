package scheduler

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/warden-dev/warden/governor"
	"github.com/warden-dev/warden/governor/pool"
	"github.com/warden-dev/warden/scheduler/store"
)

// recover rebuilds the admission state from the store after a start:
//
//   - QUEUED runs go back in the index.
//   - STARTING runs were admitted but their delivery was never acknowledged
//     (the process died or was drained out between admission and the
//     worker's answer): they return to QUEUED and their rate slot is
//     refunded when its window is still current. Their next delivery
//     carries the next x-run-attempt, so a worker that did see the
//     interrupted attempt can tell.
//   - RUNNING runs belong to the worker (it answered 202): they hold their
//     lane, key, permits and pool slot again; start_to_close counts from
//     their start, heartbeat_timeout from now (heartbeats are not persisted).
//   - RETRY_WAIT and SCHEDULED runs get their timer back.
//
// onResume, when not nil, is told of each RUNNING run taken back, with
// s.mu held. A shared store recovers differently (admit_postgres.go).
func (s *Scheduler) recover(ctx context.Context, c *governor.Controls, onResume func(*active)) error {
	if err := s.loadCounts(ctx); err != nil {
		return fmt.Errorf("count runs: %w", err)
	}
	var starting, running []uint64
	type wait struct {
		seq uint64
		at  int64
	}
	var waits []wait
	queued := 0
	s.mu.Lock()
	err := s.st.Unfinished(ctx, func(r *store.Run) error {
		switch r.Status {
		case store.Queued:
			s.q.push(s.q.def(r.Name), r.Key, r.Seq, r.Priority, r.QueuedAt)
			queued++
		case store.Starting:
			starting = append(starting, r.Seq)
		case store.Running:
			running = append(running, r.Seq)
		case store.RetryWait, store.Scheduled:
			waits = append(waits, wait{r.Seq, r.RetryAt})
		}
		return nil
	})
	if cfg := s.cfgPtr.Load(); cfg != nil {
		for _, d := range cfg.order {
			if dq := s.q.defs[d.name]; dq != nil && dq.fifoOn {
				// Pushed in seq order; deadlines go by queue entry time.
				sortFIFO(s.q, dq.fifo[dq.fifoHead:])
			}
			s.armSTSLocked(d)
		}
	}
	s.mu.Unlock()
	if err != nil {
		return err
	}
	now := s.clk.Now()
	for _, seq := range starting {
		r, err := s.st.Get(ctx, seq)
		if err != nil {
			return err
		}
		refunded := false
		if r.PoolID != "" && r.WindowStart != 0 {
			if p := c.Pools.ByID(r.PoolID); p != nil {
				p.RefundAt(store.Time(r.WindowStart))
				refunded = true
			}
		}
		r.Status, r.QueuedAt, r.PoolID, r.WindowStart = store.Queued, now.UnixNano(), "", 0
		if err := s.st.Update(ctx, &r, store.Of(store.Starting)); err != nil {
			return err
		}
		s.moved(store.Starting, store.Queued)
		s.mu.Lock()
		s.adm.enqueueLocked(&r)
		s.mu.Unlock()
		s.log.Info("run interrupted between admission and delivery returned to the queue",
			"run", s.formatID(seq), "attempt", r.Attempt, "rate_slot_refunded", refunded)
	}
	// Newest admission first: when the runs outnumber a semaphore's
	// permits, a permit lease expired before the restart (the sweeper
	// gave it to a later run) and the oldest admissions are the ones that
	// lost theirs.
	resumed := make([]store.Run, 0, len(running))
	for _, seq := range running {
		r, err := s.st.Get(ctx, seq)
		if err != nil {
			return err
		}
		resumed = append(resumed, r)
	}
	slices.SortStableFunc(resumed, func(a, b store.Run) int { return cmp.Compare(b.StartedAt, a.StartedAt) })
	for _, r := range resumed {
		s.resume(r, now, onResume)
	}
	for _, w := range waits {
		s.armRetry(w.seq, w.at)
	}
	if n := len(starting) + len(running) + len(waits) + queued; n > 0 {
		s.log.Info("runs recovered", "queued", queued+len(starting), "requeued_from_starting", len(starting),
			"running", len(running), "retry_wait", len(waits))
	}
	return nil
}

// resume takes a RUNNING run back: it holds its gates again.
func (s *Scheduler) resume(r store.Run, now time.Time, onResume func(*active)) {
	cfg := s.cfgPtr.Load()
	var d *definition
	if cfg != nil {
		d = cfg.defs[r.Name]
	}
	var lease pool.Lease
	if d != nil && d.pool != nil {
		// Before locking: a shared pool takes its lease in Redis.
		lease = d.pool.Resume()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	dq := s.q.def(r.Name)
	a := &active{seq: r.Seq, run: r, def: d, q: dq, key: r.Key, prio: r.Priority, queuedAt: r.QueuedAt,
		admittedAt: r.StartedAt, phase: phaseAsync, heartbeatAt: now.UnixNano(), lease: lease}
	if d != nil {
		for _, name := range d.semaphores {
			sem := s.sems[name]
			if sem == nil {
				continue
			}
			if len(sem.holders) >= sem.permits {
				s.log.Warn("running run resumed without its semaphore permit: its lease expired before the restart and a later run holds it",
					"semaphore", name, "run", s.formatID(r.Seq))
				continue
			}
			sem.holders[a] = 0
			a.sems = append(a.sems, name)
		}
		s.leaseSemaphores(a.sems, a, now.UnixNano()+int64(a.leaseTerm()))
	}
	s.q.resumed(dq, r.Key)
	s.running++
	s.active[r.Seq] = a
	if onResume != nil {
		onResume(a)
	}
	a.mu.Lock()
	s.armRunTimer(a)
	a.mu.Unlock()
}
