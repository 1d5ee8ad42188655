package scheduler

import (
	"context"
	"errors"
	"time"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/scheduler/store"
)

// A run's move to RUNNING, RETRY_WAIT or its end must reach the store even
// when the store is down at that moment (a Postgres restart, a network
// blip): a row left STARTING under this sidecar's renewed lease would hold
// its lane fleet-wide for ever, and a restart would deliver work already
// done again. Such a write is kept here and tried again, backing off, until
// it lands, the run has moved on in the store, or the scheduler closes; a
// restart's recovery takes over from there.
const (
	rewriteFirst = 100 * time.Millisecond
	rewriteMax   = 5 * time.Second
)

// pendingWrite is a run's record waiting to be written.
type pendingWrite struct {
	r       store.Run
	prev    store.Status   // the status the run moves from (metrics)
	allowed store.Statuses // what the stored run may be for the write to apply
	timer   clock.Timer
}

// write stores r, moving the run from prev, if the stored run is in
// allowed. A failure other than the run having moved on is retried in the
// background; meanwhile the API shows the run as r (pendingViewLocked).
func (s *Scheduler) write(r store.Run, prev store.Status, allowed store.Statuses) {
	err := s.st.Update(context.Background(), &r, allowed)
	if err == nil || moveOn(err) {
		s.dropPending(r.Seq, nil) // a write of the run still waiting is outdated
		if err == nil {
			s.landed(r, prev)
		}
		return
	}
	s.log.Error("record "+r.Status.String()+"; retrying", "run", s.formatID(r.Seq), "err", err)
	s.retryWrite(&pendingWrite{r: r, prev: prev, allowed: allowed}, rewriteFirst)
}

// landed follows a write of r that has reached the store.
func (s *Scheduler) landed(r store.Run, prev store.Status) {
	s.moved(prev, r.Status)
	if r.Status == store.RetryWait {
		// At its RetryAt, so a write that waited out a store outage
		// waits only what is left of the delay.
		s.armRetry(r.Seq, r.RetryAt)
	}
}

// moveOn reports whether a failed write must not be retried: the run is
// not in a state the write applies to any more (another transition, a
// sweep took it back), or it is gone.
func moveOn(err error) bool {
	return errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound)
}

// retryWrite arms p's next attempt after delay. A later write of the same
// run replaces an earlier one still waiting (an end after RUNNING).
func (s *Scheduler) retryWrite(p *pendingWrite, delay time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		s.log.Warn("closed with a run's record not written; the restart recovers the run", "run", s.formatID(p.r.Seq), "record", p.r.Status.String())
		return
	}
	if old := s.pending[p.r.Seq]; old != nil && old != p {
		old.timer.Stop()
	}
	s.pending[p.r.Seq] = p
	s.npending.Store(int64(len(s.pending)))
	p.timer = s.clk.AfterFunc(delay, func() { s.rewrite(p, delay) })
}

func (s *Scheduler) rewrite(p *pendingWrite, delay time.Duration) {
	if !s.enter() {
		return
	}
	defer s.leave()
	s.mu.Lock()
	current := s.pending[p.r.Seq] == p
	s.mu.Unlock()
	if !current {
		return // replaced by a later write of the run
	}
	ctx, cancel := context.WithTimeout(s.runCtx, sharedCallTimeout)
	r := p.r
	err := s.st.Update(ctx, &r, p.allowed)
	cancel()
	switch {
	case err == nil:
		if s.dropPending(p.r.Seq, p) {
			s.log.Info("recorded "+p.r.Status.String()+" after retrying", "run", s.formatID(p.r.Seq))
			s.landed(p.r, p.prev)
		}
	case moveOn(err):
		s.dropPending(p.r.Seq, p)
	default:
		s.retryWrite(p, min(2*delay, rewriteMax))
	}
}

// dropPending forgets seq's waiting write if it is p (any when p is nil),
// stopping its timer; it reports whether p was the one waiting. With none
// waiting at all, as nearly always, it takes no lock.
func (s *Scheduler) dropPending(seq uint64, p *pendingWrite) bool {
	if s.npending.Load() == 0 {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.pending[seq]
	if cur == nil || p != nil && cur != p {
		return false
	}
	if p == nil {
		cur.timer.Stop()
	}
	delete(s.pending, seq)
	s.npending.Store(int64(len(s.pending)))
	return true
}

// pendingViewLocked is the run as its waiting write will store it.
func (s *Scheduler) pendingViewLocked(seq uint64, now time.Time) (RunView, bool) {
	p := s.pending[seq]
	if p == nil {
		return RunView{}, false
	}
	return s.viewLocked(p.r, now), true
}
