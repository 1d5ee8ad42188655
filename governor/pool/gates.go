package pool

import (
	"context"
	"time"

	"github.com/warden-dev/warden/governor/control"
	"github.com/warden-dev/warden/governor/window"
)

// gates decides a pool's concurrency and rate gates. There are two: in
// process (localGates, local.go) and shared by every sidecar through Redis
// (sharedGates, shared.go). newGates picks one when the pool is built; the
// Pool keeps the queue, the leases and the metrics, and asks its gates.
type gates interface {
	// acquire is Pool.Acquire: admit, or queue for at most max_wait.
	acquire(ctx context.Context, priority int, now time.Time) (Lease, error)
	// tryAcquire is Pool.TryAcquire: admit without queueing.
	tryAcquire(now time.Time) (Lease, control.Name, bool)
	// tryAcquireWith is Pool.TryAcquireWith.
	tryAcquireWith(extra []window.LeaseWant, now time.Time) (Lease, control.Name, bool, []window.LeaseGot)
	// dispatch admits waiters from the head of the queue while the gates
	// have room, then tells the OnFree subscribers.
	dispatch()
	// holdingLocked names the gate holding the head of the queue, and
	// reports whether a gate is known shut at now. p.mu is held.
	holdingLocked(now time.Time) (control.Name, bool)
	// watchLocked arms whatever wakes waiters and subscribers when the
	// gate holding them may open. p.mu is held.
	watchLocked(now time.Time)
	// retryAfter is how long until the rate window reopens; 0 when
	// unknown or open.
	retryAfter(now time.Time) time.Duration
	// resume takes a slot for work already running (Pool.Resume).
	resume() window.Held
	// onReleased is called once a released shared slot is back in Redis.
	onReleased() func()
	// holders counts the slots held by every sidecar, when known.
	holders(now time.Time) (int64, bool)
	// shared reports gates decided in Redis (Pool.Shared).
	shared() bool
}

// newGates chooses p's gates, once: shared ones when c is the Redis
// counter, in-process ones for any other.
func newGates(p *Pool, c window.Counter) gates {
	if r, ok := c.(*window.Redis); ok {
		s := &sharedGates{p: p, red: r}
		s.freedFn = s.freed
		return s
	}
	return localGates{p: p}
}
