package pool

import (
	"container/heap"
	"context"
	"math"
	"time"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/control"
	"github.com/warden-dev/warden/governor/window"
)

// Shared pools (backend.kind redis). Each admission is one round trip to
// Redis (window.Redis.TakeLeased, through the batched admit script): it
// sweeps the pool's expired leases, checks the concurrency gate (a sorted
// set of leases) and the rate window together, and takes both or neither.
// The pool's mutex is never held across that round trip: admissions run
// unlocked, and the queue is served by one dispatcher at a time, which
// takes the pool's state under the lock, admits unlocked, and hands the
// lease to the head waiter under the lock again.
//
// A waiter is retried when a slot of this sidecar frees (once Redis has it
// back), when the rate window ends, and every SharedRetryEvery while the
// concurrency gate holds it: a slot held by another sidecar frees without
// this one hearing of it, and a short poll of one batched admission is
// cheaper and simpler to keep right than a pub/sub channel per pool (no
// subscription to lose across Redis restarts, no message to miss between
// a refusal and a subscribe).
//
// While Redis is down, fail_open pools fall back to this sidecar's own
// concurrency count and in-process window (with the full limits), and
// fail_closed pools refuse with control upstream; the next admission after
// the backend's probe sees Redis again is shared again.

// SharedRetryEvery is how often waiters held by a shared concurrency gate
// are retried: the longest a slot freed on another sidecar stays unused.
const SharedRetryEvery = 50 * time.Millisecond

// leaseKind names the pools' lease sets in Redis (lease:pool:ID).
const leaseKind = "pool"

// sharedGates decides a pool's gates in Redis. Its dispatch state is under
// Pool.mu.
type sharedGates struct {
	p   *Pool
	red *window.Redis

	dispatching bool         // a dispatcher is serving the queue
	again       bool         // capacity may have freed while it was on the wire
	blocked     control.Name // the control that refused the last admission
	blockedEnd  time.Time    // with blocked == pool_rate: when the window ends
	tick        clock.Timer
	tickArmed   bool
	// set is the pool's lease set key, built for setPrefix.
	set, setPrefix string
	// freedFn is freed as a func value made once: a method value made
	// per release would allocate.
	freedFn func()
}

// leaseSetLocked is the pool's lease set key under the counter's prefix.
func (s *sharedGates) leaseSetLocked() string {
	p := s.p
	if prefix := s.red.Prefix(); s.set == "" || prefix != s.setPrefix {
		s.set, s.setPrefix = window.LeaseSet(prefix, leaseKind, p.id), prefix
	}
	return s.set
}

// take tries both gates once, in Redis when it can, without p.mu held.
func (s *sharedGates) take(now time.Time) (Lease, control.Name, bool) {
	l, ctl, ok, _ := s.takeWith(nil, now)
	return l, ctl, ok
}

// takeWith is take with the caller's extra lease gates in the same op.
// got is the extra gates' outcome when Redis decided them, nil when it
// did not (then nothing of them was taken). A refusal by an extra gate
// alone has no pool control: control is "".
func (s *sharedGates) takeWith(extra []window.LeaseWant, now time.Time) (l Lease, ctl control.Name, ok bool, got []window.LeaseGot) {
	p := s.p
	p.mu.Lock()
	cfg, scope, set := p.cfg, p.scope, s.leaseSetLocked()
	p.mu.Unlock()
	if cfg.Concurrency <= 0 && cfg.Rate <= 0 && len(extra) == 0 {
		return Lease{p: p}, "", true, nil
	}
	res, err := s.red.TakeLeasedWith(extra, scope, p.key, int64(cfg.Rate), 1, set, int64(cfg.Concurrency), now)
	if err != nil {
		if s.red.FailClosed() {
			return Lease{}, control.Upstream, false, nil
		}
		// fail_open: this sidecar's own gates, in process (no Redis call
		// under the lock: Local never leaves the process).
		p.mu.Lock()
		defer p.mu.Unlock()
		l, ctl, ok = p.tryLockedOn(s.red.Local(), now)
		if !ok && ctl == control.PoolRate {
			s.blockedEnd = s.red.Local().Peek(scope, p.key, int64(cfg.Rate)).End()
		}
		return l, ctl, ok, nil
	}
	if cfg.Rate > 0 && p.gCount != nil {
		p.gCount.Set(float64(res.Window.Count))
	}
	if !res.Admitted {
		switch {
		case !res.LeaseOK:
			return Lease{}, control.PoolConcurrency, false, res.Extra
		case cfg.Rate > 0 && !res.Window.Allowed:
			p.mu.Lock()
			s.blockedEnd = res.Window.End()
			p.mu.Unlock()
			return Lease{}, control.PoolRate, false, res.Extra
		}
		return Lease{}, "", false, res.Extra
	}
	l = Lease{p: p, held: res.Lease}
	if cfg.Rate > 0 {
		l.rated, l.start, l.windowEnd = true, res.Window.Start(), res.Window.End()
	}
	if cfg.Concurrency > 0 {
		p.mu.Lock()
		p.inFlight++
		if p.gInFlight != nil {
			p.gInFlight.Set(float64(p.inFlight))
		}
		p.mu.Unlock()
		l.slot = true
	}
	return l, "", true, res.Extra
}

// resume adds a lease for work already running (Resume), whatever
// the set holds: the work is in flight, so other sidecars must count it.
// With Redis unavailable the slot is this sidecar's only (zero Held).
func (s *sharedGates) resume() window.Held {
	p := s.p
	p.mu.Lock()
	conc, set := p.cfg.Concurrency, s.leaseSetLocked()
	p.mu.Unlock()
	if conc <= 0 {
		return window.Held{}
	}
	res, err := s.red.TakeLeased(nil, nil, 0, 0, set, math.MaxInt64, p.clk.Now())
	if err != nil {
		return window.Held{}
	}
	return res.Lease
}

func (s *sharedGates) acquire(ctx context.Context, priority int, now time.Time) (Lease, error) {
	p := s.p
	p.mu.Lock()
	freed, tried := p.freed, false
	if len(p.waiters) == 0 && !s.dispatching {
		p.mu.Unlock()
		l, ctl, ok := s.take(now)
		if ok {
			return l, nil
		}
		if ctl == control.Upstream {
			return Lease{}, p.upstreamDown()
		}
		p.mu.Lock()
		s.blocked, tried = ctl, true
	}
	if p.noWaitLocked() {
		ctl := s.controlLocked()
		p.mu.Unlock()
		return Lease{}, p.waitedZero(ctl, now)
	}
	w := p.enqueueLocked(priority)
	if w == nil {
		p.mu.Unlock()
		return Lease{}, p.queueFull(now)
	}
	s.armLocked(p.clk.Now())
	// A slot that freed between our refusal and our joining the queue
	// found nobody to wake: serve the queue now rather than at the tick.
	raced := tried && p.freed != freed
	p.mu.Unlock()
	if raced {
		s.dispatch()
	}
	return p.wait(ctx, w, now)
}

func (s *sharedGates) tryAcquire(now time.Time) (Lease, control.Name, bool) {
	p := s.p
	p.mu.Lock()
	if len(p.waiters) > 0 {
		ctl := s.controlLocked()
		p.mu.Unlock()
		return Lease{}, ctl, false
	}
	p.mu.Unlock()
	l, ctl, ok := s.take(now)
	if !ok {
		p.mu.Lock()
		s.blocked = ctl
		// Subscribers (the scheduler) wait outside the queue: keep them
		// posted about slots other sidecars free.
		if len(p.onFree) > 0 {
			s.armLocked(p.clk.Now())
		}
		p.mu.Unlock()
	}
	return l, ctl, ok
}

// tryAcquireWith is TryAcquireWith on shared gates.
func (s *sharedGates) tryAcquireWith(extra []window.LeaseWant, now time.Time) (l Lease, ctl control.Name, ok bool, got []window.LeaseGot) {
	p := s.p
	p.mu.Lock()
	if len(p.waiters) > 0 {
		ctl := s.controlLocked()
		p.mu.Unlock()
		return Lease{}, ctl, false, nil
	}
	p.mu.Unlock()
	l, ctl, ok, got = s.takeWith(extra, now)
	if !ok && ctl != "" {
		p.mu.Lock()
		s.blocked = ctl
		if len(p.onFree) > 0 {
			s.armLocked(p.clk.Now())
		}
		p.mu.Unlock()
	}
	return l, ctl, ok, got
}

// controlLocked names the control holding the queue.
func (s *sharedGates) controlLocked() control.Name {
	p := s.p
	switch {
	case s.blocked != "":
		return s.blocked
	case p.cfg.Concurrency > 0:
		return control.PoolConcurrency
	default:
		return control.PoolRate
	}
}

// dispatch admits waiters from the head of the queue while Redis
// admits, one round trip each, with the lock released during each.
func (s *sharedGates) dispatch() {
	p := s.p
	p.mu.Lock()
	if s.dispatching {
		s.again = true
		p.mu.Unlock()
		return
	}
	s.dispatching = true
	var spare []Lease
	refused := false
	for len(p.waiters) > 0 {
		s.again = false
		p.mu.Unlock()
		l, ctl, ok := s.take(p.clk.Now())
		p.mu.Lock()
		if !ok {
			s.blocked, refused = ctl, true
			if s.again {
				continue // something freed during the round trip
			}
			break
		}
		s.blocked = ""
		if len(p.waiters) == 0 {
			// The waiter gave up while we were admitting it.
			spare = append(spare, l)
			break
		}
		w := heap.Pop(&p.waiters).(*waiter)
		w.granted, w.lease = true, l
		close(w.ready)
	}
	s.dispatching = false
	p.setQueued()
	if refused {
		s.armLocked(p.clk.Now())
	}
	p.unlockAndNotify()
	for _, l := range spare {
		l.Release()
		l.Refund()
	}
}

// armLocked schedules the next retry of whoever waits: at the
// window's end when the rate gate refused, after SharedRetryEvery when the
// concurrency gate did (or the backend was down). now must be the clock's
// current time, not an admission's (which may predate the boundary).
func (s *sharedGates) armLocked(now time.Time) {
	p := s.p
	if len(p.waiters) == 0 && len(p.onFree) == 0 {
		return
	}
	if s.blocked == control.PoolRate && !s.blockedEnd.IsZero() {
		if !s.blockedEnd.After(now) {
			// The window ended while the refusal was on its way back:
			// its boundary timer may have fired already. Retry now.
			p.clk.AfterFunc(0, p.dispatch)
			return
		}
		p.armWindowLocked(s.blockedEnd)
		return
	}
	if s.tickArmed {
		return
	}
	s.tickArmed = true
	s.tick = p.clk.AfterFunc(SharedRetryEvery, s.onTick)
}

func (s *sharedGates) onTick() {
	p := s.p
	p.mu.Lock()
	s.tickArmed = false
	p.mu.Unlock()
	s.dispatch()
}

// freed runs once Redis has a released slot back (in the lease
// client's release goroutine, which must not wait on admissions).
func (s *sharedGates) freed() {
	p := s.p
	p.mu.Lock()
	p.freed++
	s.again = true
	wanted := len(p.waiters) > 0 || len(p.onFree) > 0
	p.mu.Unlock()
	if wanted {
		go s.dispatch()
	}
}

func (s *sharedGates) shared() bool       { return true }
func (s *sharedGates) onReleased() func() { return s.freedFn }

// holdingLocked names the gate the last admission found shut. Whether it
// still is only Redis knows: shut is never reported.
func (s *sharedGates) holdingLocked(time.Time) (control.Name, bool) {
	return s.controlLocked(), false
}

func (s *sharedGates) watchLocked(now time.Time) { s.armLocked(now) }

// retryAfter is the time until the window the last refusal found full
// ends; 0 when the concurrency gate refused.
func (s *sharedGates) retryAfter(now time.Time) time.Duration {
	s.p.mu.Lock()
	defer s.p.mu.Unlock()
	if s.blocked == control.PoolRate && s.blockedEnd.After(now) {
		return s.blockedEnd.Sub(now)
	}
	return 0
}

// holders counts every sidecar's leases, when Redis can say.
func (s *sharedGates) holders(now time.Time) (int64, bool) {
	s.p.mu.Lock()
	set := s.leaseSetLocked()
	s.p.mu.Unlock()
	return s.red.LeaseHolders(set, now)
}
