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

// sharedState is a shared pool's dispatch state, under Pool.mu.
type sharedState struct {
	dispatching bool         // a dispatcher is serving the queue
	again       bool         // capacity may have freed while it was on the wire
	blocked     control.Name // the control that refused the last admission
	blockedEnd  time.Time    // with blocked == pool_rate: when the window ends
	freed       uint64       // counts frees, to notice one racing a refusal
	tick        clock.Timer
	tickArmed   bool
	// set is the pool's lease set key, built for setPrefix.
	set, setPrefix string
	// freedFn is freedShared as a func value made once: a method value
	// made per release would allocate.
	freedFn func()
}

// leaseSetLocked is the pool's lease set key under the counter's prefix.
func (p *Pool) leaseSetLocked() string {
	if prefix := p.shared.Prefix(); p.sh.set == "" || prefix != p.sh.setPrefix {
		p.sh.set, p.sh.setPrefix = window.LeaseSet(prefix, leaseKind, p.id), prefix
	}
	return p.sh.set
}

// take tries both gates once, in Redis when it can, without p.mu held.
func (p *Pool) take(now time.Time) (Lease, control.Name, bool) {
	l, ctl, ok, _ := p.takeWith(nil, now)
	return l, ctl, ok
}

// takeWith is take with the caller's extra lease gates in the same op.
// got is the extra gates' outcome when Redis decided them, nil when it
// did not (then nothing of them was taken). A refusal by an extra gate
// alone has no pool control: control is "".
func (p *Pool) takeWith(extra []window.LeaseWant, now time.Time) (l Lease, ctl control.Name, ok bool, got []window.LeaseGot) {
	p.mu.Lock()
	cfg, scope, set := p.cfg, p.scope, p.leaseSetLocked()
	p.mu.Unlock()
	if cfg.Concurrency <= 0 && cfg.Rate <= 0 && len(extra) == 0 {
		return Lease{p: p}, "", true, nil
	}
	res, err := p.shared.TakeLeasedWith(extra, scope, p.key, int64(cfg.Rate), 1, set, int64(cfg.Concurrency), now)
	if err != nil {
		if p.shared.FailClosed() {
			return Lease{}, control.Upstream, false, nil
		}
		// fail_open: this sidecar's own gates, in process (no Redis call
		// under the lock: Local never leaves the process).
		p.mu.Lock()
		defer p.mu.Unlock()
		l, ctl, ok = p.tryLockedOn(p.shared.Local(), now)
		if !ok && ctl == control.PoolRate {
			p.sh.blockedEnd = p.shared.Local().Peek(scope, p.key, int64(cfg.Rate)).End()
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
			p.sh.blockedEnd = res.Window.End()
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

// resumeShared adds a lease for work already running (Resume), whatever
// the set holds: the work is in flight, so other sidecars must count it.
// With Redis unavailable the slot is this sidecar's only (zero Held).
func (p *Pool) resumeShared() window.Held {
	p.mu.Lock()
	conc, set := p.cfg.Concurrency, p.leaseSetLocked()
	p.mu.Unlock()
	if conc <= 0 {
		return window.Held{}
	}
	res, err := p.shared.TakeLeased(nil, nil, 0, 0, set, math.MaxInt64, p.clk.Now())
	if err != nil {
		return window.Held{}
	}
	return res.Lease
}

func (p *Pool) acquireShared(ctx context.Context, priority int, now time.Time) (Lease, error) {
	p.mu.Lock()
	freed, tried := p.sh.freed, false
	if len(p.waiters) == 0 && !p.sh.dispatching {
		p.mu.Unlock()
		l, ctl, ok := p.take(now)
		if ok {
			return l, nil
		}
		if ctl == control.Upstream {
			return Lease{}, p.upstreamDown()
		}
		p.mu.Lock()
		p.sh.blocked, tried = ctl, true
	}
	if p.noWaitLocked() {
		ctl := p.sharedControlLocked()
		p.mu.Unlock()
		return Lease{}, p.waitedZero(ctl, now)
	}
	w := p.enqueueLocked(priority)
	if w == nil {
		p.mu.Unlock()
		return Lease{}, p.queueFull(now)
	}
	p.armSharedLocked(p.clk.Now())
	// A slot that freed between our refusal and our joining the queue
	// found nobody to wake: serve the queue now rather than at the tick.
	raced := tried && p.sh.freed != freed
	p.mu.Unlock()
	if raced {
		p.dispatchShared()
	}
	return p.wait(ctx, w, now)
}

func (p *Pool) tryAcquireShared(now time.Time) (Lease, control.Name, bool) {
	p.mu.Lock()
	if len(p.waiters) > 0 {
		ctl := p.sharedControlLocked()
		p.mu.Unlock()
		return Lease{}, ctl, false
	}
	p.mu.Unlock()
	l, ctl, ok := p.take(now)
	if !ok {
		p.mu.Lock()
		p.sh.blocked = ctl
		// Subscribers (the scheduler) wait outside the queue: keep them
		// posted about slots other sidecars free.
		if len(p.onFree) > 0 {
			p.armSharedLocked(p.clk.Now())
		}
		p.mu.Unlock()
	}
	return l, ctl, ok
}

// TryAcquireWith is TryAcquire for a caller with lease gates of its own
// (the scheduler's lane and semaphore permits) that must be taken together
// with the pool's: on a shared pool they travel in the pool's op, all
// taken or none in one round trip. got has one entry per extra gate when
// Redis decided them; nil means it did not (no shared backend, Redis
// unavailable, or the pool refused before asking) and nothing of them was
// taken. A refusal by an extra gate alone reports control "". On a pool
// that is not shared, got is always nil.
func (p *Pool) TryAcquireWith(extra []window.LeaseWant, now time.Time) (l Lease, ctl control.Name, ok bool, got []window.LeaseGot) {
	if p.shared == nil {
		l, ctl, ok = p.TryAcquire(now)
		return l, ctl, ok, nil
	}
	p.mu.Lock()
	if len(p.waiters) > 0 {
		ctl := p.sharedControlLocked()
		p.mu.Unlock()
		return Lease{}, ctl, false, nil
	}
	p.mu.Unlock()
	l, ctl, ok, got = p.takeWith(extra, now)
	if !ok && ctl != "" {
		p.mu.Lock()
		p.sh.blocked = ctl
		if len(p.onFree) > 0 {
			p.armSharedLocked(p.clk.Now())
		}
		p.mu.Unlock()
	}
	return l, ctl, ok, got
}

// sharedControlLocked names the control holding the queue.
func (p *Pool) sharedControlLocked() control.Name {
	switch {
	case p.sh.blocked != "":
		return p.sh.blocked
	case p.cfg.Concurrency > 0:
		return control.PoolConcurrency
	default:
		return control.PoolRate
	}
}

// dispatchShared admits waiters from the head of the queue while Redis
// admits, one round trip each, with the lock released during each.
func (p *Pool) dispatchShared() {
	p.mu.Lock()
	if p.sh.dispatching {
		p.sh.again = true
		p.mu.Unlock()
		return
	}
	p.sh.dispatching = true
	var spare []Lease
	refused := false
	for len(p.waiters) > 0 {
		p.sh.again = false
		p.mu.Unlock()
		l, ctl, ok := p.take(p.clk.Now())
		p.mu.Lock()
		if !ok {
			p.sh.blocked, refused = ctl, true
			if p.sh.again {
				continue // something freed during the round trip
			}
			break
		}
		p.sh.blocked = ""
		if len(p.waiters) == 0 {
			// The waiter gave up while we were admitting it.
			spare = append(spare, l)
			break
		}
		w := heap.Pop(&p.waiters).(*waiter)
		w.granted, w.lease = true, l
		close(w.ready)
	}
	p.sh.dispatching = false
	p.setQueued()
	if refused {
		p.armSharedLocked(p.clk.Now())
	}
	p.unlockAndNotify()
	for _, l := range spare {
		l.Release()
		l.Refund()
	}
}

// armSharedLocked schedules the next retry of whoever waits: at the
// window's end when the rate gate refused, after SharedRetryEvery when the
// concurrency gate did (or the backend was down). now must be the clock's
// current time, not an admission's (which may predate the boundary).
func (p *Pool) armSharedLocked(now time.Time) {
	if len(p.waiters) == 0 && len(p.onFree) == 0 {
		return
	}
	if p.sh.blocked == control.PoolRate && !p.sh.blockedEnd.IsZero() {
		if !p.sh.blockedEnd.After(now) {
			// The window ended while the refusal was on its way back:
			// its boundary timer may have fired already. Retry now.
			p.clk.AfterFunc(0, p.dispatch)
			return
		}
		p.armWindowLocked(p.sh.blockedEnd)
		return
	}
	if p.sh.tickArmed {
		return
	}
	p.sh.tickArmed = true
	p.sh.tick = p.clk.AfterFunc(SharedRetryEvery, p.onTick)
}

func (p *Pool) onTick() {
	p.mu.Lock()
	p.sh.tickArmed = false
	p.mu.Unlock()
	p.dispatchShared()
}

// freedShared runs once Redis has a released slot back (in the lease
// client's release goroutine, which must not wait on admissions).
func (p *Pool) freedShared() {
	p.mu.Lock()
	p.sh.freed++
	p.sh.again = true
	wanted := len(p.waiters) > 0 || len(p.onFree) > 0
	p.mu.Unlock()
	if wanted {
		go p.dispatchShared()
	}
}
