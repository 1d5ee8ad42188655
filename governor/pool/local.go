package pool

import (
	"container/heap"
	"context"
	"time"

	"github.com/warden-dev/warden/governor/control"
	"github.com/warden-dev/warden/governor/window"
)

// localGates decides a pool's gates in process: its concurrency count and
// its counter's window (an in-memory one, or a shared counter's in-process
// fallback). Callers queue in the pool while a gate is shut; a release, a
// refund or the window's end dispatches them.
type localGates struct{ p *Pool }

func (localGates) shared() bool                    { return false }
func (localGates) resume() window.Held             { return window.Held{} }
func (localGates) onReleased() func()              { return nil }
func (localGates) holders(time.Time) (int64, bool) { return 0, false }

// holdingLocked names the gate holding the head of the queue at now, and
// whether it is shut.
func (l localGates) holdingLocked(now time.Time) (control.Name, bool) {
	_, ctl, shut := l.blockedLocked(now)
	return ctl, shut
}

func (l localGates) watchLocked(now time.Time) { l.armLocked(now) }

// acquire queues in the pool while a gate is shut.
func (l localGates) acquire(ctx context.Context, priority int, now time.Time) (Lease, error) {
	p := l.p
	p.mu.Lock()
	var ctl control.Name
	if len(p.waiters) == 0 {
		l, c, ok := l.tryLocked(now)
		if ok {
			p.mu.Unlock()
			return l, nil
		}
		if c == control.Upstream {
			p.mu.Unlock()
			return Lease{}, p.upstreamDown()
		}
		ctl = c
	}
	if p.noWaitLocked() {
		if ctl == "" {
			_, ctl, _ = l.blockedLocked(now)
		}
		p.mu.Unlock()
		return Lease{}, p.waitedZero(ctl, now)
	}
	w := p.enqueueLocked(priority)
	if w == nil {
		p.mu.Unlock()
		return Lease{}, p.queueFull(now)
	}
	l.armLocked(now)
	p.mu.Unlock()
	return p.wait(ctx, w, now)
}

// tryAcquire refuses while others queue: they are ahead.
func (l localGates) tryAcquire(now time.Time) (Lease, control.Name, bool) {
	p := l.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.waiters) > 0 {
		_, ctl, _ := l.blockedLocked(now)
		if ctl == "" {
			ctl = control.PoolQueue
		}
		return Lease{}, ctl, false
	}
	return l.tryLocked(now)
}

// tryLocked takes a slot of both gates or neither.
func (l localGates) tryLocked(now time.Time) (Lease, control.Name, bool) {
	p := l.p
	return p.tryLockedOn(p.counter, now)
}

// tryLockedOn is tryLocked counting the rate gate in c: the pool's
// counter, or the in-process fallback of a shared one.
func (p *Pool) tryLockedOn(c window.Counter, now time.Time) (Lease, control.Name, bool) {
	if p.cfg.Concurrency > 0 && p.inFlight >= p.cfg.Concurrency {
		return Lease{}, control.PoolConcurrency, false
	}
	l := Lease{p: p}
	if p.cfg.Rate > 0 {
		d := c.Take(p.scope, p.key, int64(p.cfg.Rate), 1, now)
		if p.gCount != nil && !d.Unavailable {
			p.gCount.Set(float64(d.Count))
		}
		if !d.Allowed {
			if d.Unavailable {
				return Lease{}, control.Upstream, false
			}
			return Lease{}, control.PoolRate, false
		}
		l.rated, l.start, l.windowEnd = true, d.Start(), d.End()
	}
	if p.cfg.Concurrency > 0 {
		p.inFlight++
		l.slot = true
		if p.gInFlight != nil {
			p.gInFlight.Set(float64(p.inFlight))
		}
	}
	return l, "", true
}

// blockedLocked reports which gate holds the head of the queue at now, and
// when the rate gate reopens.
func (l localGates) blockedLocked(now time.Time) (time.Time, control.Name, bool) {
	p := l.p
	if p.cfg.Concurrency > 0 && p.inFlight >= p.cfg.Concurrency {
		return time.Time{}, control.PoolConcurrency, true
	}
	if p.cfg.Rate > 0 {
		if d := p.counter.Peek(p.scope, p.key, int64(p.cfg.Rate)); !d.Allowed {
			return d.End(), control.PoolRate, true
		}
	}
	return time.Time{}, "", false
}

// retryAfter is the time until the rate window ends, 0 when the rate gate
// is open.
func (l localGates) retryAfter(now time.Time) time.Duration {
	p := l.p
	if p.cfg.Rate <= 0 {
		return 0
	}
	d := p.counter.Peek(p.scope, p.key, int64(p.cfg.Rate))
	if d.Allowed {
		return 0
	}
	return d.ResetIn(now)
}

// dispatch admits waiters from the head of the queue while both gates have
// room, then tells subscribers that capacity may be free.
func (l localGates) dispatch() {
	p := l.p
	now := p.clk.Now()
	p.mu.Lock()
	for len(p.waiters) > 0 {
		l, _, ok := l.tryLocked(now)
		if !ok {
			break
		}
		w := heap.Pop(&p.waiters).(*waiter)
		w.granted, w.lease = true, l
		close(w.ready)
	}
	p.setQueued()
	l.armLocked(now)
	p.unlockAndNotify()
}

// armLocked sets a timer at the end of the rate window when waiters are held
// by the rate gate, so that they are released at the boundary.
func (l localGates) armLocked(now time.Time) {
	p := l.p
	if len(p.waiters) == 0 && len(p.onFree) == 0 {
		return
	}
	end, ctl, blocked := l.blockedLocked(now)
	if !blocked || ctl != control.PoolRate {
		return
	}
	p.armWindowLocked(end)
}

// tryAcquireWith has no extra gates to carry in process: it is tryAcquire,
// and got is always nil.
func (l localGates) tryAcquireWith(_ []window.LeaseWant, now time.Time) (Lease, control.Name, bool, []window.LeaseGot) {
	le, ctl, ok := l.tryAcquire(now)
	return le, ctl, ok, nil
}
