package scheduler

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/warden-dev/warden/scheduler/store"
)

// formatID is a run's public id: its store sequence in decimal, after the
// store's scope and a dash when the store has one (store.IDScoper:
// "3f9a1c0e52d1-42"), so that ids never repeat across standalone
// sidecars; a shared store's sequence alone ("42").
func (s *Scheduler) formatID(seq uint64) string {
	n := strconv.FormatUint(seq, 10)
	if sc := s.idScope(); sc != "" {
		return sc + "-" + n
	}
	return n
}

// parseID reads an id formatID wrote. A bare sequence is accepted with
// any store: it is what ids were before stores had scopes, and clients
// may have kept them. An id scoped to another store names no run here.
func (s *Scheduler) parseID(id string) (uint64, bool) {
	if scope, seq, scoped := strings.Cut(id, "-"); scoped {
		if sc := s.idScope(); sc == "" || scope != sc {
			return 0, false
		}
		id = seq
	}
	seq, err := strconv.ParseUint(id, 10, 64)
	return seq, err == nil && seq > 0
}

func (s *Scheduler) idScope() string {
	if p := s.scope.Load(); p != nil {
		return *p
	}
	return ""
}

// deliverRun records an admission (STARTING, with the rate window it was
// counted in) and hands the run to the worker. With a store that queues
// the write (bbolt: store.AsyncStarter) the delivery starts as soon as the
// STARTING write is queued, not after its fsync: a freed lane reaches the
// next run in microseconds instead of one disk flush, and every later write
// of the run (its end, RUNNING, RETRY_WAIT) is applied after that one. The
// price, paid only by a crash in the few milliseconds before the group
// commit lands: such a run is still QUEUED on restart, so it is delivered
// again with the same x-run-attempt and its rate slot stays counted (it
// may have reached the worker). A run whose STARTING record did land is
// requeued with the next attempt and its slot refunded (recover.go).
func (s *Scheduler) deliverRun(a *active) {
	defer s.deliveries.Done()
	adm := store.Admission{At: a.admittedAt}
	if ws := a.lease.WindowStart(); !ws.IsZero() {
		adm.PoolID, adm.WindowStart = a.def.pool.ID(), ws.UnixNano()
	}
	var r store.Run
	var err error
	if as, ok := s.st.(store.AsyncStarter); ok {
		// The write's outcome is waited for by a drain like the delivery.
		s.deliveries.Add(1)
		r, err = as.StartAsync(s.runCtx, a.seq, adm, func(err error) { s.startWritten(a, err) })
		if err != nil {
			s.deliveries.Done()
		}
	} else {
		r, err = s.st.Start(s.runCtx, a.seq, adm)
	}
	if err == nil {
		// A run back from a retry wait was counted by the budget already.
		if r.RetryAt == 0 && a.def.retry != nil {
			a.def.retry.RecordExecution()
		}
		r.RetryAt = 0
	}
	if err != nil {
		s.admissionFailed(a, err)
		return
	}
	s.moved(store.Queued, store.Starting)
	s.deliverRecorded(a, r)
}

// startWritten receives the outcome of a queued STARTING write, on the
// store's committer. A failure (the store broke or refused) leaves a run
// the worker may already have in QUEUED: its delivery is abandoned, its
// gates freed without a refund, and it waits again unless it has ended
// meanwhile (then its end was not recorded either and a restart finds it
// QUEUED).
func (s *Scheduler) startWritten(a *active, err error) {
	if err == nil {
		s.deliveries.Done()
		return
	}
	go func() {
		defer s.deliveries.Done()
		if _, ok := a.end(); ok {
			s.unadmit(a, err)
		}
		s.log.Error("admission not recorded after the delivery started; the run may reach the worker again with the same attempt",
			"run", s.formatID(a.seq), "err", err)
	}()
}

// deliverRecorded hands a run whose STARTING record is durable to the
// worker and acts on the answer.
func (s *Scheduler) deliverRecorded(a *active, r store.Run) {
	a.mu.Lock()
	a.run = r
	a.phase = phaseDelivering
	a.heartbeatAt = a.admittedAt
	s.armRunTimer(a)
	a.mu.Unlock()
	if s.stopping.Load() {
		a.ctx.cancel() // a drain gave up on deliveries while this one was being recorded
	}

	reply := s.deliv(&a.ctx, Delivery{RunID: s.formatID(a.seq), Name: r.Name, Attempt: int(r.Attempt), Tenant: r.Tenant, Input: r.Input})
	s.handleReply(a, reply)
}

// admissionFailed undoes an admission whose STARTING record could not be
// written: the delivery never started, so the rate slot is refunded and the
// run waits again (unless it is not QUEUED any more, e.g. timed out).
func (s *Scheduler) admissionFailed(a *active, err error) {
	a.end()
	a.lease.Refund()
	s.unadmit(a, err)
	if !errors.Is(err, store.ErrClosed) && !errors.Is(err, context.Canceled) {
		s.log.Error("admission not recorded; run returned to the queue", "run", s.formatID(a.seq), "err", err)
	}
	// No immediate pass: a failing store would spin. The next event
	// (submission, completion, boundary) retries.
}

// unadmit frees what an admission whose STARTING write failed with err
// holds and puts the run back in the queue, unless the store says it is not
// QUEUED any more (a conflict, an unknown run) or the scheduler is stopping.
func (s *Scheduler) unadmit(a *active, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.releaseLocked(a)
	if !errors.Is(err, store.ErrConflict) && !errors.Is(err, store.ErrNotFound) && !s.draining && !s.closed {
		s.q.push(a.q, a.key, a.seq, a.prio, a.queuedAt)
	}
}

// handleReply moves the run on after the worker answered.
func (s *Scheduler) handleReply(a *active, rep Reply) {
	if s.stopping.Load() && rep.Err != nil {
		// Abandoned by a drain that ran out of time: the run stays
		// STARTING in the store and a restart queues it again.
		a.end()
		return
	}
	o := classify(rep)
	switch o.kind {
	case outAccepted:
		s.accepted(a)
	case outCompleted:
		s.finish(a, store.Completed, rep.Body, "", "")
	case outTerminal:
		s.finish(a, store.FailedTerminal, nil, o.reason, "")
	case outRetryable:
		s.fail(a, o.reason, rep.RetryAfter)
	}
}

// accepted: the worker answered 202 and owns the run until it calls
// complete; its semaphore permits become leases renewed by heartbeats.
func (s *Scheduler) accepted(a *active) {
	now := s.clk.Now().UnixNano()
	a.mu.Lock()
	if a.done {
		a.mu.Unlock()
		return
	}
	a.phase = phaseAsync
	a.heartbeatAt = now
	a.run.Status = store.Running
	r := a.run
	s.armRunTimer(a)
	a.mu.Unlock()
	s.adm.leasePermits(a, now+int64(a.leaseTerm()))
	s.write(r, store.Starting, store.Of(store.Starting))
}

// leaseTerm is how long a permit held by an accepted run lasts without a
// heartbeat.
func (a *active) leaseTerm() time.Duration {
	if a.def != nil && a.def.heartbeat > 0 {
		return a.def.heartbeat
	}
	return permitLease
}

// finish ends a run for good. It reports false when another transition
// (a timeout, a complete call, a drain) got there first.
func (s *Scheduler) finish(a *active, st store.Status, output []byte, reason, control string) bool {
	r, ok := a.end()
	if !ok {
		return false
	}
	s.free(a)
	from := r.Status
	r.Status, r.FinishedAt, r.Output, r.Reason, r.Control = st, s.clk.Now().UnixNano(), output, reason, control
	s.write(r, from, store.Of(store.Starting, store.Running))
	s.ended(a.seq) // over in memory, whenever the store takes it: its sessions must go
	return true
}

// fail handles a retryable failure: RETRY_WAIT with the policy's delay
// while attempts and budget last, FAILED after. A worker that asked for a
// longer wait (asked, its Retry-After) gets it, up to max_delay, as Cloud
// Tasks considers a worker's Retry-After.
func (s *Scheduler) fail(a *active, reason string, asked time.Duration) bool {
	a.mu.Lock()
	done, attempt := a.done, int(a.run.Attempt)
	a.mu.Unlock()
	if done {
		return false
	}
	var retry bool
	var control string
	if a.def != nil && a.def.retry != nil {
		ok, by := a.def.retry.ShouldRetry(attempt, reason)
		retry, control = ok, string(by)
	}
	if !retry {
		return s.finish(a, store.Failed, nil, reason, control)
	}
	delay := a.def.retry.DelayAsked(attempt, asked)
	r, ok := a.end()
	if !ok {
		return false
	}
	s.free(a)
	from := r.Status
	r.Status, r.Reason, r.RetryAt = store.RetryWait, reason, s.clk.Now().Add(delay).UnixNano()
	s.write(r, from, store.Of(store.Starting, store.Running))
	return true
}

// armRetry puts a RETRY_WAIT or SCHEDULED run in the queue at its
// RetryAt (Unix nanoseconds), at once if that has passed.
func (s *Scheduler) armRetry(seq uint64, at int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.armRetryLocked(seq, at)
}

// armRetryLocked is armRetry with s.mu held.
func (s *Scheduler) armRetryLocked(seq uint64, at int64) {
	if s.draining || s.closed {
		return // persisted as RETRY_WAIT or SCHEDULED; a restart re-arms it
	}
	s.waits[seq] = s.clk.AfterFuncAt(time.Unix(0, at), func() { s.requeue(seq) })
}

// requeue ends a retry wait, or a scheduled run's wait for its
// not_before: the run is QUEUED, keeping its age.
func (s *Scheduler) requeue(seq uint64) {
	if !s.enter() {
		return
	}
	defer s.leave()
	full, err := s.st.Get(context.Background(), seq)
	if err != nil || full.Status != store.RetryWait && full.Status != store.Scheduled {
		s.mu.Lock()
		delete(s.waits, seq)
		s.mu.Unlock()
		return
	}
	now := s.clk.Now()
	from := full.Status
	// A retried run keeps RetryAt: it tells the next admission this
	// attempt was already counted by the retry budget. A scheduled run
	// starts out as a new one.
	if from == store.Scheduled {
		full.RetryAt = 0
	}
	full.Status, full.QueuedAt = store.Queued, now.UnixNano()
	if err := s.st.Update(context.Background(), &full, store.Of(from)); err != nil {
		s.mu.Lock()
		delete(s.waits, seq)
		s.mu.Unlock()
		if !errors.Is(err, store.ErrConflict) { // a shared store's sweep may have requeued it first
			s.log.Error("requeue after retry wait", "run", s.formatID(seq), "err", err)
		}
		return
	}
	s.moved(from, store.Queued)
	s.mu.Lock()
	delete(s.waits, seq)
	s.adm.enqueueLocked(&full)
	started := s.admitLocked(now)
	s.mu.Unlock()
	s.launch(started)
}

// pushLocked puts a QUEUED run in this sidecar's index (the local and
// Redis admitters' enqueueLocked).
func (s *Scheduler) pushLocked(r *store.Run) {
	dq := s.q.def(r.Name)
	s.q.push(dq, r.Key, r.Seq, r.Priority, r.QueuedAt)
	if cfg := s.cfgPtr.Load(); cfg != nil {
		if d := cfg.defs[r.Name]; d != nil {
			s.armSTSLocked(d)
		}
	}
}
