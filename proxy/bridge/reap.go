package bridge

import "time"

// Reaping is event-driven: each session has one timer on the bridge clock,
// armed for the earliest moment a limit could be reached. The copy loops
// never touch it; they only record when the session last went idle. When it
// fires, check decides from the recorded state: reap, or re-arm for the
// next possible moment (a busy session cannot be reaped sooner than one
// full timeout after it next goes idle). So a timer fires at most once per
// timeout per session, never per query.

// minCheck keeps a timer from spinning if a deadline computes as past.
const minCheck = time.Millisecond

// check is the timer's callback.
func (s *session) check() {
	if s.endCause() != causeNone {
		return
	}
	now := s.clk.Now()
	cfg := &s.g.cfg
	if cfg.MaxLifetime > 0 && now.Sub(s.born) >= cfg.MaxLifetime {
		// Mark first, read the state second: the copy loop publishes the
		// state first and reads the mark second (see forwardServer).
		s.closeIdle.CompareAndSwap(int32(causeNone), int32(causeMaxLifetime))
	}
	st := s.state(now)
	if c := cause(s.closeIdle.Load()); c != causeNone && st == stIdle {
		s.end(c)
		return
	}
	idleFor := now.Sub(s.lastTraffic())
	switch {
	case st == stIdle && cfg.IdleTimeout > 0 && idleFor >= cfg.IdleTimeout:
		s.end(causeIdle)
		return
	case st == stIdleInTx && cfg.IdleInTransactionTimeout > 0 && idleFor >= cfg.IdleInTransactionTimeout:
		s.end(causeIdleInTx)
		return
	}
	s.rearm(now)
}

// rearm sets the timer for the next moment check could act, if any.
func (s *session) rearm(now time.Time) {
	s.timerMu.Lock()
	defer s.timerMu.Unlock()
	select {
	case <-s.done: // ended: its timer is stopped for good
		return
	default:
	}
	d, ok := s.nextCheck(now)
	switch {
	case !ok:
	case s.timer == nil:
		s.timer = s.clk.AfterFunc(d, s.check)
	default:
		s.timer.Reset(d)
	}
}

// nextCheck is how long from now until a limit could next be reached.
func (s *session) nextCheck(now time.Time) (time.Duration, bool) {
	cfg := &s.g.cfg
	var d time.Duration
	ok := false
	at := func(t time.Time) {
		if x := t.Sub(now); !ok || x < d {
			d, ok = x, true
		}
	}
	last := s.lastTraffic()
	marked := s.closeIdle.Load() != int32(causeNone)
	if s.pg {
		switch s.state(now) {
		case stIdle:
			if cfg.IdleTimeout > 0 {
				at(last.Add(cfg.IdleTimeout))
			}
		case stIdleInTx:
			if cfg.IdleInTransactionTimeout > 0 {
				at(last.Add(cfg.IdleInTransactionTimeout))
			}
		default:
			// Not idle: the earliest reap is a full timeout after it
			// next goes idle, which is later than now.
			if cfg.IdleTimeout > 0 {
				at(now.Add(cfg.IdleTimeout))
			}
			if cfg.IdleInTransactionTimeout > 0 {
				at(now.Add(cfg.IdleInTransactionTimeout))
			}
		}
		// A marked Postgres session is closed by its copy loop the moment
		// it goes idle; no timer needed for that.
	} else {
		if cfg.IdleTimeout > 0 {
			at(last.Add(cfg.IdleTimeout))
		}
		if marked {
			at(last.Add(s.quietPeriod())) // a tcp pipe is idle once quiet
		}
	}
	if cfg.MaxLifetime > 0 && !marked {
		at(s.born.Add(cfg.MaxLifetime))
	}
	return max(d, minCheck), ok
}

// closeWhenIdle ends the session now if it is idle, else at its next idle
// moment (a transaction in progress finishes first).
func (s *session) closeWhenIdle(c cause) {
	s.closeIdle.Store(int32(c))
	now := s.clk.Now()
	if s.state(now) == stIdle {
		s.end(c)
		return
	}
	if !s.pg {
		s.rearm(now) // only the timer can see a tcp pipe go quiet
	}
}

// watchRun ends the session when its bound run reaches a final state.
func (s *session) watchRun() {
	select {
	case <-s.runEnded:
		s.end(causeRunEnded)
	case <-s.done:
	}
}
