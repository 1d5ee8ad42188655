package scheduler

import (
	"context"
	"fmt"
	"time"

	"github.com/warden-dev/warden/scheduler/store"
)

// The three timeouts of a definition (SPEC §6) end a run TIMED_OUT with
// control "timeout"; 0 arms nothing. schedule_to_start is one timer per
// definition at the deadline of its oldest waiting run (runs enter the
// queue in deadline order); start_to_close and heartbeat are one timer per
// admitted run at the earlier of the two deadlines.

// runDeadline is when an admitted run times out, and which timeout that
// is; a.mu is held.
func runDeadline(a *active) (int64, string) {
	if a.def == nil {
		return 0, ""
	}
	var at int64
	var why string
	if a.def.startToClose > 0 {
		at, why = a.run.StartedAt+int64(a.def.startToClose), fmt.Sprintf("start_to_close_timeout %s exceeded", a.def.startToClose)
	}
	if a.def.heartbeat > 0 {
		if hb := a.heartbeatAt + int64(a.def.heartbeat); at == 0 || hb < at {
			at, why = hb, fmt.Sprintf("heartbeat_timeout %s exceeded without a heartbeat", a.def.heartbeat)
		}
	}
	return at, why
}

// armRunTimer (re)arms an admitted run's timeout timer; a.mu is held.
func (s *Scheduler) armRunTimer(a *active) {
	at, _ := runDeadline(a)
	if at == 0 {
		if a.timer != nil {
			a.timer.Stop()
		}
		return
	}
	d := time.Duration(at - s.clk.Now().UnixNano())
	if a.timer == nil {
		a.timer = s.clk.AfterFunc(d, func() { s.runTimerFired(a) })
		return
	}
	a.timer.Reset(d)
}

func (s *Scheduler) runTimerFired(a *active) {
	if !s.enter() {
		return
	}
	defer s.leave()
	now := s.clk.Now().UnixNano()
	a.mu.Lock()
	if a.done {
		a.mu.Unlock()
		return
	}
	at, why := runDeadline(a)
	if at == 0 || at > now {
		// A heartbeat moved the deadline since the timer was set.
		s.armRunTimer(a)
		a.mu.Unlock()
		return
	}
	a.mu.Unlock()
	s.finish(a, store.TimedOut, nil, why, ControlTimeout)
}

// armSTSLocked makes sure d's schedule_to_start timer fires no later than
// the deadline of its oldest waiting run.
func (s *Scheduler) armSTSLocked(d *definition) {
	dq := s.q.defs[d.name]
	if dq == nil || d.scheduleToStart <= 0 || s.draining || s.closed {
		return
	}
	h, ok := s.q.oldest(dq)
	if !ok {
		return
	}
	at := s.q.slab[h].queuedAt + int64(d.scheduleToStart)
	if dq.stsAt != 0 && dq.stsAt <= at {
		return // armed for this deadline or an earlier one; it re-arms when it fires
	}
	dq.stopTimer()
	dq.stsAt = at
	dq.stsTimer = s.clk.AfterFuncAt(time.Unix(0, at), func() { s.stsFired(dq) })
}

type expiredRun struct {
	seq     uint64
	control string
	waited  time.Duration
}

// stsFired times out every run of dq that waited longer than
// schedule_to_start_timeout, naming in its reason the control that held it.
func (s *Scheduler) stsFired(dq *defQueue) {
	if !s.enter() {
		return
	}
	defer s.leave()
	now := s.clk.Now()
	s.mu.Lock()
	dq.stsAt = 0
	cfg := s.cfgPtr.Load()
	var d *definition
	if cfg != nil {
		d = cfg.defs[dq.name]
	}
	if d == nil || d.scheduleToStart <= 0 || s.draining {
		s.mu.Unlock()
		return
	}
	var expired []expiredRun
	for {
		h, ok := s.q.oldest(dq)
		if !ok {
			break
		}
		e := s.q.slab[h]
		if e.queuedAt+int64(d.scheduleToStart) > now.UnixNano() {
			break
		}
		control := s.controlLocked(dq, e.g.key, now)
		s.q.remove(h)
		expired = append(expired, expiredRun{seq: e.seq, control: control, waited: time.Duration(now.UnixNano() - e.queuedAt)})
	}
	s.armSTSLocked(d)
	s.mu.Unlock()
	for _, x := range expired {
		r, err := s.st.Get(context.Background(), x.seq)
		if err != nil {
			s.log.Error("record schedule_to_start timeout", "run", s.formatID(x.seq), "err", err)
			continue
		}
		if r.Status != store.Queued {
			continue
		}
		r.Status, r.FinishedAt, r.Control = store.TimedOut, now.UnixNano(), ControlTimeout
		r.Reason = fmt.Sprintf("schedule_to_start_timeout %s exceeded: waited %s, held by %s", d.scheduleToStart, x.waited.Round(time.Millisecond), x.control)
		s.write(r, store.Queued, store.Of(store.Queued))
		s.ended(x.seq)
	}
}
