// Package governor assembles warden's controls for one policy: pools, tenant
// caps, circuit breakers and retry policies, rebuilt on every reload with the
// state of unchanged controls carried over. The data plane and the scheduler
// read the current Controls with one atomic load per request.
package governor

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/warden-dev/warden/governor/breaker"
	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/metrics"
	"github.com/warden-dev/warden/governor/pool"
	"github.com/warden-dev/warden/governor/tenant"
	"github.com/warden-dev/warden/governor/window"
	"github.com/warden-dev/warden/policy"
)

// Controls is every control of one policy. It is immutable once published;
// the controls inside carry their own synchronised state.
type Controls struct {
	Policy      *policy.Policy
	Pools       *pool.Set
	IngressCaps *tenant.Caps // nil: no ingress tenant cap
	EgressCaps  *tenant.Caps // nil: no egress tenant cap
	Targets     map[string]*Target
}

// Governor owns the controls across reloads.
type Governor struct {
	clk     clock.Clock
	m       *metrics.Metrics
	counter window.Counter
	mu      sync.Mutex // serialises Apply
	cur     atomic.Pointer[Controls]
}

// New returns a governor counting windows in counter. Call Apply before
// Current.
func New(clk clock.Clock, m *metrics.Metrics, counter window.Counter) *Governor {
	g := &Governor{clk: clk, m: m, counter: counter}
	if m != nil {
		// warden_breaker_state is read from the breakers when scraped:
		// one gauge per target however many share a breaker, and a breaker
		// leaves open lazily, at its next call, which a scrape must not
		// wait for to show it half-open.
		m.OnGather(g.refreshBreakerGauges)
		// warden_pool_window_count too: a window ends, and a refund gives
		// a slot back, without any admission to set the gauge.
		m.OnGather(g.refreshPoolCounts)
	}
	return g
}

// refreshPoolCounts sets each pool's warden_pool_window_count to the count
// of its current window, under the lock Apply holds, like
// refreshBreakerGauges.
func (g *Governor) refreshPoolCounts() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if c := g.cur.Load(); c != nil && c.Pools != nil {
		c.Pools.RefreshCounts()
	}
}

// refreshBreakerGauges sets each target's warden_breaker_state to its
// breaker's state now. It holds the lock Apply does, so that it never
// sets the gauge of a target a concurrent reload has just removed.
func (g *Governor) refreshBreakerGauges() {
	g.mu.Lock()
	defer g.mu.Unlock()
	c := g.cur.Load()
	if c == nil {
		return
	}
	for name, t := range c.Targets {
		if !t.Breaker.Enabled() {
			// No breaker, no gauge (a reload may have disabled it).
			g.m.BreakerState.DeleteLabelValues(name)
			continue
		}
		g.m.BreakerState.WithLabelValues(name).Set(float64(t.Breaker.State()))
	}
}

// Counter is the window counter every control shares.
func (g *Governor) Counter() window.Counter { return g.counter }

// Current returns the controls in force.
func (g *Governor) Current() *Controls { return g.cur.Load() }

// Apply builds the controls of p and publishes them. Pools and targets that
// keep their name and settings keep their state (breaker state, retry
// budget, in-flight counts, windows); windows live in the counter, so tenant
// counts survive any reload.
func (g *Governor) Apply(p *policy.Policy) *Controls {
	g.mu.Lock()
	defer g.mu.Unlock()
	old := g.cur.Load()
	c := &Controls{Policy: p, Targets: map[string]*Target{}}
	if old == nil {
		c.Pools = pool.NewSet(p.Pools, g.counter, g.clk, g.m)
	} else {
		c.Pools = old.Pools.Rebuild(p.Pools)
	}
	if p.Ingress != nil {
		c.IngressCaps = tenant.New("ingress", p.Ingress.Tenant, p.Ingress.Tenants, g.counter, g.m)
	}
	if p.Egress != nil {
		c.EgressCaps = tenant.New("egress", p.Egress.Tenant, p.Egress.Tenants, g.counter, g.m)
	}
	leaders := p.BreakerLeaders()
	claimed := map[*breaker.Breaker]bool{}
	for i, t := range p.Targets {
		var prev, leader *Target
		if old != nil {
			prev = old.Targets[t.Name]
		}
		if l := leaders[i]; l != i {
			leader = c.Targets[p.Targets[l].Name]
		}
		nt := g.buildTarget(t, prev, leader, c.Pools, claimed)
		c.Targets[t.Name] = nt
	}
	setProbeLeases(p.Targets, c.Targets)
	if old != nil && g.m != nil {
		for name := range old.Targets {
			if _, ok := c.Targets[name]; !ok {
				g.m.BreakerState.DeleteLabelValues(name)
			}
		}
	}
	g.cur.Store(c)
	return c
}

// Tenants lists a page of the live tenant windows of both listeners,
// busiest first (tenant.List).
func (c *Controls) Tenants(limit int, after *tenant.Cursor, now time.Time) ([]tenant.Usage, *tenant.Cursor) {
	return tenant.List([]*tenant.Caps{c.IngressCaps, c.EgressCaps}, limit, after, now)
}

// Tenant looks one tenant up on both listeners (tenant.Find).
func (c *Controls) Tenant(name string, now time.Time) []tenant.Usage {
	return tenant.Find([]*tenant.Caps{c.IngressCaps, c.EgressCaps}, name, now)
}

// probeLeaseMargin covers the work after a timed-out exchange gives up and
// before its probe reports.
const probeLeaseMargin = time.Second

// setProbeLeases bounds each breaker's half-open probe by the longest any
// target sending through it may take: its timeout, which bounds the whole
// exchange (queue wait and streamed body included). A target with no
// timeout leaves its breaker's probe unbounded.
func setProbeLeases(targets []policy.Target, built map[string]*Target) {
	lease := map[*breaker.Breaker]time.Duration{}
	for _, t := range targets {
		b := built[t.Name].Breaker
		d, seen := lease[b]
		switch {
		case t.Timeout <= 0 || (seen && d == 0):
			lease[b] = 0
		default:
			lease[b] = max(d, t.Timeout+probeLeaseMargin)
		}
	}
	for b, d := range lease {
		b.SetProbeLease(d)
	}
}
