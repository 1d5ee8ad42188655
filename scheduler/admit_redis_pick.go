package scheduler

import (
	"strings"
	"sync"
	"time"

	"github.com/warden-dev/warden/governor/pool"
	"github.com/warden-dev/warden/governor/window"
)

// One pass of the Redis admitter (admit_redis.go): pick the best waiting
// run under the lock, ask Redis for its gates outside it, then commit the
// admission or put the run back.

// pick is one run picked for admission through the shared gates.
type pick struct {
	a     *active
	wants []window.LeaseWant // the lane, then a.sems in order

	// The outcome, set unlocked by takeGates.
	ok      bool
	control string            // the pool's refusal, or upstream
	got     []window.LeaseGot // the lease gates' outcome when Redis decided them
	lease   pool.Lease        // the pool's admission
}

// maxInFlight bounds the admissions one pass asks Redis at once.
const maxInFlight = 16

// admitWaiting admits waiting runs, each one round trip with Scheduler.mu
// released, until nothing more can start. It reports whether a run was
// refused by a gate whose freeing nobody announces (retry on the tick).
//
// Several admissions travel together — the client's batcher sends them in
// one script call — as many as the lanes had free at the last answer
// (rg.free; at most maxInFlight). While lanes are plenty, their order does
// not matter: all of them start. When lanes are scarce, rg.free is 1 and
// admissions go one at a time, best first, so a sidecar's own priority
// order holds where it decides who starts.
func (rg *redisAdmitter) admitWaiting() (retry bool) {
	s := rg.s
	s.mu.Lock()
	s.pass++
	for {
		var picks []*pick
		for len(picks) < max(rg.free, 1) {
			c := rg.pickLocked()
			if c == nil {
				break
			}
			picks = append(picks, c)
		}
		if len(picks) == 0 {
			s.mu.Unlock()
			return retry
		}
		s.mu.Unlock()
		if len(picks) == 1 {
			rg.takeGates(picks[0])
		} else {
			var wg sync.WaitGroup
			for _, c := range picks {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rg.takeGates(c)
				}()
			}
			wg.Wait()
		}
		now := s.clk.Now()
		type refusal struct {
			c       *pick
			control string // "" when a drain began
		}
		var started []*active
		var refused []refusal
		stop := false
		free := maxInFlight
		s.mu.Lock()
		cfg := s.cfgPtr.Load()
		for _, c := range picks {
			admitted, control, halt := rg.settleLocked(c, now)
			stop = stop || halt
			if admitted {
				started = append(started, c.a)
			} else {
				refused = append(refused, refusal{c, control})
			}
			free = min(free, lanesFree(cfg, c, admitted))
		}
		rg.free = free
		s.mu.Unlock()
		for _, r := range refused {
			giveBack(r.c)
			switch r.control {
			case "":
				// Put back because a drain began.
			case ControlPoolRate:
				r.c.a.def.pool.WatchWindow() // woken at the window's boundary
			case ControlPoolQueue:
				// Others wait in the pool ahead of it: its OnFree wakes the pass.
			default:
				retry = true
			}
		}
		s.launch(started)
		s.mu.Lock()
		if stop {
			s.mu.Unlock()
			return retry
		}
	}
}

// lanesFree is how many lanes c's answer says are free after it: what the
// next round may ask for at once. Unknown (no answer from Redis, no
// config) counts as one; a refusal as none.
func lanesFree(cfg *config, c *pick, admitted bool) int {
	switch {
	case !admitted:
		return 0
	case len(c.got) == 0 || cfg == nil:
		return 1
	}
	return max(int(int64(cfg.lanes)-c.got[0].Holders), 0)
}

// pickLocked takes the best waiting run that this sidecar's own gates
// admit out of the queue, its local lane, key slot and permits reserved;
// nil when there is none. The choice is the local admitter's: the best
// head (priority, then age) among definitions not blocked in this pass.
func (rg *redisAdmitter) pickLocked() *pick {
	s := rg.s
	cfg := s.cfgPtr.Load()
	if cfg == nil || s.draining || s.closed {
		return nil
	}
	limit, _ := cfg.limit()
	for s.running < limit {
		best, top := s.bestHeadLocked(cfg)
		if best == nil {
			return nil
		}
		if !s.semaphoresFree(best) {
			best.skip = s.pass
			continue
		}
		dq := s.q.defs[best.name]
		e := s.q.admit(dq)
		a := &active{seq: e.seq, def: best, q: dq, key: e.g.key, prio: top.prio, queuedAt: e.queuedAt}
		a.sems = s.acquireSemaphores(best, a)
		s.running++
		s.deliveries.Add(1)
		prefix := rg.red.Prefix()
		c := &pick{a: a, wants: make([]window.LeaseWant, 0, 1+len(a.sems))}
		c.wants = append(c.wants, window.LeaseWant{Set: window.LeaseSet(prefix, laneKind, laneName), Limit: int64(cfg.lanes)})
		for _, name := range a.sems {
			c.wants = append(c.wants, window.LeaseWant{Set: window.LeaseSet(prefix, semKind, name), Limit: int64(cfg.semaphores[name])})
		}
		return c
	}
	return nil
}

// takeGates asks Redis for c's gates, without Scheduler.mu: the lane and
// permits in the op of the definition's pool when the pool is shared, else
// alone.
func (rg *redisAdmitter) takeGates(c *pick) {
	s := rg.s
	now := s.clk.Now()
	p := c.a.def.pool
	if p != nil && p.Shared() {
		l, by, ok, got := p.TryAcquireWith(c.wants, now)
		c.lease, c.control, c.ok, c.got = l, string(by), ok, got
		return
	}
	res, err := rg.red.TakeLeasedWith(c.wants, nil, nil, 0, 0, "", 0, now)
	switch {
	case err != nil && rg.red.FailClosed():
		c.control = ControlUpstream
		return
	case err != nil:
		c.ok = true // fail_open: the local reservations made at the pick decide
	default:
		c.ok, c.got = res.Admitted, res.Extra
	}
	if !c.ok || p == nil {
		return
	}
	// A pool on another counter than the scheduler's (not the case with
	// the app's wiring, where both are the backend's): its gates are in
	// process and cost no round trip.
	l, control, ok := p.TryAcquire(now)
	if !ok {
		// The lane and permits taken are given back with the refusal.
		c.ok, c.control = false, string(control)
		return
	}
	c.lease = l
}

// settleLocked commits c's admission or puts the run back in the queue.
// It reports the refusing control ("" when a drain began meanwhile), and
// whether the pass should stop. Whatever a run put back took is for
// giveBack, outside the lock.
func (rg *redisAdmitter) settleLocked(c *pick, now time.Time) (admitted bool, control string, stop bool) {
	s := rg.s
	a, d := c.a, c.a.def
	if s.draining || s.closed {
		rg.unpickLocked(a)
		return false, "", true
	}
	if c.ok {
		a.admittedAt = now.UnixNano()
		a.lease = c.lease
		a.red = &redisHeld{}
		if len(c.got) > 0 {
			a.red.lane = c.got[0].Lease
			for i, name := range a.sems {
				a.red.permits = append(a.red.permits, heldPermit{name, c.got[1+i].Lease})
			}
		} else {
			// Redis could not decide (fail_open): count the run there
			// once it can.
			a.red.adopt = true
			rg.adopt[a] = struct{}{}
		}
		s.active[a.seq] = a
		delete(rg.notes, d.name)
		if d.pool != nil {
			delete(rg.poolNotes, d.pool.ID())
		}
		rg.global = ""
		if d.waitObs != nil {
			d.waitObs.Observe(time.Duration(a.admittedAt - a.queuedAt).Seconds())
		}
		rg.decideLocked(a.seq, true, "")
		return true, "", false
	}
	rg.unpickLocked(a)
	control = refusal(c)
	rg.decideLocked(a.seq, false, control)
	switch control {
	case ControlLanes, ControlUpstream:
		// Nothing else can start now: every definition needs a lane.
		rg.global, stop = control, true
		delete(rg.notes, d.name)
	default:
		rg.notes[d.name] = control
		if d.pool != nil && strings.HasPrefix(control, "pool_") {
			rg.poolNotes[d.pool.ID()] = control
		}
		d.skip = s.pass
	}
	return false, control, stop
}

// refusal names the control that refused c, in controlLocked's order: the
// run's semaphores, its pool, then the lanes.
func refusal(c *pick) string {
	if c.control == ControlUpstream {
		return c.control
	}
	for i := 1; i < len(c.got); i++ {
		if !c.got[i].OK {
			return ControlSemaphore
		}
	}
	if c.control != "" {
		return c.control
	}
	return ControlLanes
}

// unpickLocked undoes pickLocked's reservations and puts the run back in
// its place: same priority and age, and for schedule_to_start its place
// in the definition's deadline order.
func (rg *redisAdmitter) unpickLocked(a *active) {
	s := rg.s
	s.running--
	s.q.finished(a.q, a.key)
	s.releaseSemaphores(a.sems, a)
	h := s.q.push(a.q, a.key, a.seq, a.prio, a.queuedAt)
	if a.q.fifoOn {
		s.q.placeFIFO(a.q, h)
	}
	if cfg := s.cfgPtr.Load(); cfg != nil {
		if d := cfg.defs[a.q.name]; d != nil {
			s.armSTSLocked(d)
		}
	}
	s.deliveries.Done()
}

// giveBack returns what a pick took when it was not committed (leases
// not taken are zero and inert).
func giveBack(c *pick) {
	for _, g := range c.got {
		g.Lease.Release(nil)
	}
	c.lease.Release()
	c.lease.Refund()
}
