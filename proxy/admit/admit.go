// Package admit runs a request through an egress target's controls in
// SPEC §4's order — the tenant cap, the circuit breaker, then the target's
// pools (waiting in their queues) — and through the step before each of
// its retries (Retry), for both the HTTP and the gRPC egress. Protocols
// differ only in how a refusal is written.
package admit

import (
	"context"
	"errors"
	"time"

	"github.com/warden-dev/warden/governor/breaker"
	"github.com/warden-dev/warden/governor/control"
	"github.com/warden-dev/warden/governor/pool"
	"github.com/warden-dev/warden/governor/retry"
	"github.com/warden-dev/warden/governor/tenant"
	"github.com/warden-dev/warden/proxy/stats"
)

// MaxPools is how many pools one target may name that a request holds at
// once; the policy's targets name one or two.
const MaxPools = 8

// Target is one target's controls as a route uses them.
type Target struct {
	Name    string
	Breaker *breaker.Breaker // nil or disabled: never refuses
	Retry   *retry.Policy    // nil: no retries
	Pools   []*pool.Pool
	Timeout time.Duration // whole exchange; 0: none
	Stats   *stats.Target
}

// Refusal is why a request was not admitted.
type Refusal struct {
	Control    control.Name  // tenant_rate, circuit_breaker, pool_*
	Scope      string        // the listener, target or pool refused in
	RetryAfter time.Duration // for Retry-After
	Tenant     tenant.Result // set for tenant_rate
	Pool       *pool.Rejection
	// Err is set when the wait in a pool queue was abandoned (the caller
	// went away or the listener is shutting down).
	Err error
}

// ByTenantCap reports whether the tenant cap refused (its control is
// tenant_rate, or upstream when a fail_closed shared backend is down).
func (r Refusal) ByTenantCap() bool { return r.Tenant.Tenant != nil }

// Admission is what an admitted request holds until its response
// completes. The zero value holds nothing.
type Admission struct {
	Ticket breaker.Ticket
	leases [MaxPools]pool.Lease
	n      int
}

// Admit checks the tenant cap (when caps is set), the breaker and every
// pool of t, in that order, at now. listener scopes tenant refusals. On
// refusal nothing is held: a half-open probe slot taken by Allow is given
// back with a neutral outcome and pool leases already granted are released
// and their rate slots refunded.
func Admit(ctx context.Context, a *Admission, t *Target, caps *tenant.Caps, tenantKey []byte, listener string, now time.Time) (Refusal, bool) {
	if ref, ok := checkTenant(caps, tenantKey, listener, now); !ok {
		return ref, false
	}
	ticket, retryAfter, ok := t.Breaker.Allow()
	if !ok {
		return Refusal{Control: control.CircuitBreaker, Scope: t.Name, RetryAfter: retryAfter}, false
	}
	a.Ticket = ticket
	for _, p := range t.Pools {
		// The half-open probe waits in a pool's queue like any request
		// (SPEC §4): the others keep failing fast meanwhile, as they would
		// behind a probe refused now and the next caller made the probe.
		l, err := p.Acquire(ctx, 0, now)
		if err != nil {
			a.Ticket.Done(breaker.Neutral)
			a.Ticket = breaker.Ticket{}
			a.refund()
			var rej *pool.Rejection
			if errors.As(err, &rej) {
				return Refusal{Control: rej.Control, Scope: rej.Pool, RetryAfter: rej.RetryAfter, Pool: rej}, false
			}
			return Refusal{Control: control.PoolQueue, Scope: p.ID(), Err: err}, false
		}
		if a.n < MaxPools {
			a.leases[a.n] = l
			a.n++
		} else {
			l.Release()
		}
	}
	return Refusal{}, true
}

// Ask runs, for a request that asks before it sends its body (Expect:
// 100-continue), the controls without taking anything from them: the
// tenant cap, which counts the request as Admit would; the breaker,
// without taking its half-open probe; and each pool, which refuses here
// only what its Acquire would refuse at once (pool.Refuses: its queue is
// full, or it waits for nobody and a gate is shut). Pool slots are left to
// Admit, called with caps nil once the body comes: a slot taken now would
// be held for a body that may never arrive.
func Ask(t *Target, caps *tenant.Caps, tenantKey []byte, listener string, now time.Time) (Refusal, bool) {
	if ref, ok := checkTenant(caps, tenantKey, listener, now); !ok {
		return ref, false
	}
	if retryAfter, refused := t.Breaker.Refuses(); refused {
		return Refusal{Control: control.CircuitBreaker, Scope: t.Name, RetryAfter: retryAfter}, false
	}
	for _, p := range t.Pools {
		if rej, refused := p.Refuses(now); refused {
			return Refusal{Control: rej.Control, Scope: rej.Pool, RetryAfter: rej.RetryAfter, Pool: rej}, false
		}
	}
	return Refusal{}, true
}

// checkTenant counts the request against its tenant's cap, when caps is
// set, and says why it is refused.
func checkTenant(caps *tenant.Caps, tenantKey []byte, listener string, now time.Time) (Refusal, bool) {
	if caps != nil {
		if r := caps.Check(tenantKey, now); !r.Allowed {
			return Refusal{Control: r.Control(), Scope: listener, Tenant: r, RetryAfter: time.Duration(r.RetryAfter(now)) * time.Second}, false
		}
	}
	return Refusal{}, true
}

// refund gives back what was granted before a later pool refused: the
// request never ran.
func (a *Admission) refund() {
	for i := range a.n {
		a.leases[i].Release()
		a.leases[i].Refund()
		a.leases[i] = pool.Lease{}
	}
	a.n = 0
}

// Release frees the pool concurrency slots: the response completed.
func (a *Admission) Release() {
	for i := range a.n {
		a.leases[i].Release()
		a.leases[i] = pool.Lease{}
	}
	a.n = 0
}
