// Package pool implements warden's shared pools (SPEC §4): a concurrency gate
// and a fixed-window rate gate, the most restrictive winning, with a bounded
// wait queue served by priority, then age. Pools that share a cap_key share
// one Pool: one counter, one concurrency limit, one queue.
//
// How the gates decide is chosen once, when the pool is built (gates.go):
// in process (local.go), or, on a Redis counter (backend.kind redis),
// shared by every sidecar: the concurrency gate as leases in Redis,
// admitted together with the rate window in one round trip (shared.go).
// The queue stays per sidecar, here.
package pool

import (
	"container/heap"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/control"
	"github.com/warden-dev/warden/governor/metrics"
	"github.com/warden-dev/warden/governor/window"
	"github.com/warden-dev/warden/policy"
)

// Rejection says why a pool refused and when trying again makes sense:
// control.PoolRate, PoolConcurrency or PoolQueue, or control.Upstream when
// the shared backend holding the pool's window is down and
// backend.on_error is fail_closed (SPEC §9).
type Rejection struct {
	Pool       string
	Control    control.Name
	RetryAfter time.Duration // until the rate window ends; 0 when unknown (concurrency)
	Waited     time.Duration
}

func (r *Rejection) Error() string {
	if r.Waited > 0 {
		return fmt.Sprintf("pool %s: %s after waiting %s", r.Pool, r.Control, r.Waited.Round(time.Millisecond))
	}
	return fmt.Sprintf("pool %s: %s", r.Pool, r.Control)
}

// Pool is one concurrency + rate gate and its wait queue.
type Pool struct {
	id      string
	capKey  string
	scope   *window.Scope
	key     []byte
	counter window.Counter
	clk     clock.Clock
	// g decides the gates: in process, or in Redis when the counter is
	// Redis (newGates).
	g gates

	mu       sync.Mutex
	cfg      policy.Pool
	inFlight int
	waiters  waitHeap
	seq      uint64
	timer    clock.Timer // armed at the window's end while waiters are held by the rate gate
	timerAt  time.Time
	onFree   []func()
	// freed counts slots released in process, so that an admission can
	// notice one freed while it was being refused (shared.go).
	freed uint64

	gInFlight, gQueued, gCount prometheus.Gauge
}

func newPool(cfg policy.Pool, c window.Counter, clk clock.Clock, m *metrics.Metrics) *Pool {
	id := cfg.ID()
	p := &Pool{
		id: id, capKey: cfg.CapKey, cfg: cfg, counter: c, clk: clk,
		scope: window.NewScope("pool", cfg.Window), key: []byte(id),
	}
	p.g = newGates(p, c)
	if m != nil {
		p.gInFlight = m.PoolInFlight.WithLabelValues(id)
		p.gQueued = m.PoolQueued.WithLabelValues(id)
		p.gCount = m.PoolWindowCount.WithLabelValues(id)
		// Export every pool from the start, not from its first use.
		p.gInFlight.Set(0)
		p.gQueued.Set(0)
		p.gCount.Set(0)
	}
	return p
}

// ID is the pool's counter identity: its name, or cap:KEY when shared.
func (p *Pool) ID() string { return p.id }

// Shared reports whether the pool's gates are decided in Redis (its
// counter is the Redis counter), so TryAcquireWith can carry a caller's
// lease gates in the same op.
func (p *Pool) Shared() bool { return p.g.shared() }

// Lease is an admission through a pool. The zero Lease is inert.
type Lease struct {
	p         *Pool
	slot      bool // holds a concurrency slot
	rated     bool // consumed a rate slot
	windowEnd time.Time
	start     time.Time
	held      window.Held // the slot's lease in Redis, when shared
}

// Release frees the lease's concurrency slot: the response completed.
func (l *Lease) Release() {
	if l.p == nil || !l.slot {
		return
	}
	l.slot = false
	l.p.release(l.held)
}

// Refund gives the rate slot back when the admitted work never started (the
// run was interrupted before delivery). It is a no-op once the window ended.
func (l *Lease) Refund() {
	if l.p == nil || !l.rated {
		return
	}
	l.rated = false
	l.p.counter.Refund(l.p.scope, l.p.key, l.start, 1)
	l.p.dispatch()
}

// RefundAt gives back one rate slot counted in the window that began at
// start. It serves recovery after a restart, when no Lease survives: the
// scheduler persists the window start of each admission and refunds a run
// that was interrupted before delivery. A no-op once that window ended or
// when the pool has no rate gate.
func (p *Pool) RefundAt(start time.Time) {
	p.mu.Lock()
	rated := p.cfg.Rate > 0
	p.mu.Unlock()
	if !rated || start.IsZero() {
		return
	}
	p.counter.Refund(p.scope, p.key, start, 1)
	p.dispatch()
}

// Resume takes a concurrency slot for work that is already running and was
// recovered after a restart (a run the worker accepted before warden
// stopped). It consumes no rate slot and never refuses: the work is in
// flight whether or not the pool has room, and it must be counted so that
// new admissions wait for it.
func (p *Pool) Resume() Lease {
	held := p.g.resume()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cfg.Concurrency <= 0 {
		held.Release(nil)
		return Lease{}
	}
	p.inFlight++
	if p.gInFlight != nil {
		p.gInFlight.Set(float64(p.inFlight))
	}
	return Lease{p: p, slot: true, held: held}
}

// WindowStart is when the rate window the lease was counted in began; the
// scheduler persists it so that recovery can refund the right window.
func (l *Lease) WindowStart() time.Time { return l.start }

// Acquire admits the caller through the pool at now, waiting in the queue
// (priority first, then oldest) for at most max_wait when there is no room.
// A refusal is a *Rejection naming the control.
func (p *Pool) Acquire(ctx context.Context, priority int, now time.Time) (Lease, error) {
	return p.g.acquire(ctx, priority, now)
}

// Refuses reports whether Acquire at now would refuse at once, and with
// what, without taking, counting or queueing anything: the queue has no
// room, or the pool waits for nobody (max_wait 0s) while a gate is shut.
// The egress asks it of a request that waits for 100 Continue, so that a
// body Acquire would refuse is never uploaded. It is a reading, not a
// reservation: Acquire may still refuse what it let through. On a shared
// pool only the sidecar's own queue is read; its gates are in Redis, and
// when nobody queues here a shut gate is Acquire's to find.
func (p *Pool) Refuses(now time.Time) (*Rejection, bool) {
	p.mu.Lock()
	ctl, shut := p.g.holdingLocked(now)
	if len(p.waiters) == 0 && !shut {
		p.mu.Unlock()
		return nil, false
	}
	noWait, full := p.noWaitLocked(), !p.roomLocked()
	p.mu.Unlock()
	switch {
	case noWait:
		return p.waitedZero(ctl, now), true
	case full:
		return p.queueFull(now), true
	}
	return nil, false // it would wait its turn
}

// noWaitLocked reports a pool with a queue but max_wait 0s: a caller
// without room waits at most 0s, that is, not at all, and is refused by the
// gate that blocked it, as after any other max_wait.
func (p *Pool) noWaitLocked() bool { return p.cfg.Queue > 0 && p.cfg.MaxWait <= 0 }

// waitedZero is the refusal of a caller of a no-wait pool, blocked by
// control; p.mu must not be held.
func (p *Pool) waitedZero(ctl control.Name, now time.Time) *Rejection {
	if ctl == "" {
		ctl = control.PoolQueue
	}
	return &Rejection{Pool: p.id, Control: ctl, RetryAfter: p.retryAfter(now)}
}

// upstreamDown is the refusal while the shared backend is down and
// on_error is fail_closed: waiting cannot help, so nobody queues.
func (p *Pool) upstreamDown() error {
	return &Rejection{Pool: p.id, Control: control.Upstream, RetryAfter: time.Second}
}

// roomLocked reports whether the queue has room for another waiter.
func (p *Pool) roomLocked() bool { return p.cfg.Queue > 0 && len(p.waiters) < p.cfg.Queue }

// enqueueLocked queues a waiter of priority; nil when the queue is full.
func (p *Pool) enqueueLocked(priority int) *waiter {
	if !p.roomLocked() {
		return nil
	}
	w := &waiter{priority: priority, seq: p.seq, ready: make(chan struct{})}
	if p.cfg.MaxWait > 0 {
		// Armed as the waiter joins, under the same lock: a clock moved
		// by anyone who can see the waiter queued counts against it.
		w.timeout = p.clk.NewTimer(p.cfg.MaxWait)
	}
	p.seq++
	heap.Push(&p.waiters, w)
	p.setQueued()
	return w
}

// queueFull is the refusal of a caller the queue has no room for; p.mu
// must not be held.
func (p *Pool) queueFull(now time.Time) *Rejection {
	return &Rejection{Pool: p.id, Control: control.PoolQueue, RetryAfter: p.retryAfter(now)}
}

// wait blocks until w is granted, max_wait passes or ctx ends.
func (p *Pool) wait(ctx context.Context, w *waiter, now time.Time) (Lease, error) {
	var timeout <-chan time.Time
	if w.timeout != nil {
		defer w.timeout.Stop()
		timeout = w.timeout.C()
	}
	var cancelled error
	select {
	case <-w.ready:
		return w.lease, nil
	case <-timeout:
	case <-ctx.Done():
		cancelled = ctx.Err()
	}
	p.mu.Lock()
	if w.granted {
		// Admitted while we were giving up: keep the admission rather than
		// waste a rate slot, unless the caller is gone.
		p.mu.Unlock()
		if cancelled != nil {
			w.lease.Release()
			w.lease.Refund()
			return Lease{}, fmt.Errorf("pool %s: wait abandoned: %w", p.id, cancelled)
		}
		return w.lease, nil
	}
	heap.Remove(&p.waiters, w.index)
	p.setQueued()
	waited := p.clk.Now().Sub(now)
	ctl, _ := p.g.holdingLocked(p.clk.Now())
	p.mu.Unlock()
	// Leaving may unblock those behind us (we were the head).
	p.dispatch()
	if cancelled != nil {
		return Lease{}, fmt.Errorf("pool %s: wait abandoned: %w", p.id, cancelled)
	}
	return Lease{}, &Rejection{Pool: p.id, Control: ctl, RetryAfter: p.retryAfter(p.clk.Now()), Waited: waited}
}

// TryAcquire admits without waiting; it never queues. It reports the control
// that refused. The scheduler uses it: runs wait in the durable queue, not
// here.
func (p *Pool) TryAcquire(now time.Time) (Lease, control.Name, bool) {
	return p.g.tryAcquire(now)
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
	return p.g.tryAcquireWith(extra, now)
}

// retryAfter is how long a refused caller should wait: until the rate
// window ends, 0 when that is unknown (the concurrency gate refused).
func (p *Pool) retryAfter(now time.Time) time.Duration { return p.g.retryAfter(now) }

func (p *Pool) release(h window.Held) {
	p.mu.Lock()
	p.inFlight--
	if p.gInFlight != nil {
		p.gInFlight.Set(float64(p.inFlight))
	}
	if h.Shared() {
		p.mu.Unlock()
		// Waiters are retried once Redis has the slot back, not before:
		// an earlier try would be refused and cost a round trip.
		h.Release(p.g.onReleased())
		return
	}
	p.freed++
	// Only waiters or subscribers care; skipping dispatch keeps the clock
	// read off the uncontended path.
	wanted := len(p.waiters) > 0 || len(p.onFree) > 0
	p.mu.Unlock()
	if wanted {
		p.dispatch()
	}
}

// dispatch admits waiters from the head of the queue while both gates have
// room, then tells subscribers that capacity may be free.
func (p *Pool) dispatch() { p.g.dispatch() }

// unlockAndNotify releases p.mu and, when no waiter is left to take the
// capacity that may have freed, tells the OnFree subscribers.
func (p *Pool) unlockAndNotify() {
	idle := len(p.waiters) == 0
	subs := p.onFree
	p.mu.Unlock()
	if idle {
		for _, f := range subs {
			f()
		}
	}
}

// armWindowLocked sets the boundary timer at end (the rate window's end),
// which dispatches the queue and subscribers then.
func (p *Pool) armWindowLocked(end time.Time) {
	if p.timer != nil && p.timerAt.Equal(end) {
		return
	}
	if p.timer != nil {
		p.timer.Stop()
	}
	p.timerAt = end
	p.timer = p.clk.AfterFuncAt(end, p.dispatch)
}

// OnFree registers f to be called whenever capacity may have become free
// (a release, a refund, a window boundary, a reset) and no waiter took it.
// f must not block.
func (p *Pool) OnFree(f func()) {
	p.mu.Lock()
	p.onFree = append(p.onFree, f)
	p.mu.Unlock()
}

// WatchWindow arms the boundary timer for subscribers that are waiting on
// the rate gate outside the pool's own queue (the scheduler).
func (p *Pool) WatchWindow() {
	p.mu.Lock()
	p.g.watchLocked(p.clk.Now())
	p.mu.Unlock()
}

// Reset restores the pool's full rate allowance without moving its boundary.
// Concurrency counts are untouched.
func (p *Pool) Reset() {
	p.mu.Lock()
	rate, scope := p.cfg.Rate, p.scope
	p.mu.Unlock()
	// Only a pool with a rate gate has a window to reset, as Snapshot
	// only reads one then (a counter has no bounds for a window of 0).
	if rate > 0 {
		p.counter.Reset(scope, p.key)
	}
	if p.gCount != nil {
		p.gCount.Set(0)
	}
	p.dispatch()
}

// refreshCount sets the window-count gauge from the counter; a counter
// that cannot say (the shared backend down) leaves it as it was.
func (p *Pool) refreshCount() {
	p.mu.Lock()
	rate, scope := p.cfg.Rate, p.scope
	p.mu.Unlock()
	if p.gCount == nil || rate <= 0 {
		return
	}
	if d := p.counter.Peek(scope, p.key, int64(rate)); !d.Unavailable {
		p.gCount.Set(float64(d.Count))
	}
}

func (p *Pool) update(cfg policy.Pool) {
	p.mu.Lock()
	if cfg.Window != p.cfg.Window {
		p.scope = window.NewScope("pool", cfg.Window)
	}
	p.cfg = cfg
	p.mu.Unlock()
	p.dispatch() // a larger limit may admit waiters
}

func (p *Pool) setQueued() {
	if p.gQueued != nil {
		p.gQueued.Set(float64(len(p.waiters)))
	}
}

// Snapshot is a pool's state for GET /v1/pools.
type Snapshot struct {
	ID               string  `json:"id"`
	CapKey           string  `json:"cap_key"`
	Rate             int     `json:"rate"`
	Window           int     `json:"window"`
	Count            int64   `json:"count"`
	Remaining        int64   `json:"remaining"`
	ExpiresInSeconds float64 `json:"expires_in_seconds"`
	Concurrency      int     `json:"concurrency"`
	InFlight         int     `json:"in_flight"`
	Queued           int     `json:"queued"`
}

// Snapshot reports the pool's state at now.
func (p *Pool) Snapshot(now time.Time) Snapshot {
	p.mu.Lock()
	cfg, inFlight, queued := p.cfg, p.inFlight, len(p.waiters)
	p.mu.Unlock()
	s := Snapshot{ID: p.id, CapKey: p.capKey, Rate: cfg.Rate, Window: int(cfg.Window),
		Concurrency: cfg.Concurrency, InFlight: inFlight, Queued: queued}
	if cfg.Concurrency > 0 {
		if n, ok := p.g.holders(now); ok {
			s.InFlight = int(n) // every sidecar's, when Redis can say
		}
	}
	if cfg.Rate > 0 {
		d := p.counter.Peek(p.scope, p.key, int64(cfg.Rate))
		s.Count, s.Remaining = d.Count, d.Remaining()
		s.ExpiresInSeconds = d.ResetIn(now).Seconds()
	}
	return s
}

type waiter struct {
	priority int
	seq      uint64
	index    int
	ready    chan struct{}
	timeout  clock.Timer // max_wait; nil: none
	granted  bool
	lease    Lease
}

// waitHeap orders waiters by priority (higher first), then arrival.
type waitHeap []*waiter

func (h waitHeap) Len() int { return len(h) }
func (h waitHeap) Less(i, j int) bool {
	if h[i].priority != h[j].priority {
		return h[i].priority > h[j].priority
	}
	return h[i].seq < h[j].seq
}
func (h waitHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *waitHeap) Push(x any) {
	w := x.(*waiter)
	w.index = len(*h)
	*h = append(*h, w)
}
func (h *waitHeap) Pop() any {
	old := *h
	w := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return w
}
