package tenant

import (
	"iter"
	"time"

	"github.com/warden-dev/warden/governor/window"
)

// Usage is one tenant's live window, for GET /v1/tenants.
type Usage struct {
	Listener         string  `json:"listener"`
	Tenant           string  `json:"tenant"`
	Limit            int64   `json:"limit"`
	Window           int     `json:"window"`
	Count            int64   `json:"count"`
	Remaining        int64   `json:"remaining"`
	ExpiresInSeconds float64 `json:"expires_in_seconds"`
	// Overflow marks the overflow window (Tenant is then
	// "tenant_overflow"): the tenants first seen beyond max_keys, together.
	Overflow bool `json:"overflow,omitempty"`
}

// Usage yields every live window of this listener: each tenant's, then the
// overflow window when it is live. It holds one window at a time, however
// many tenants there are; yield must not call the counter.
func (c *Caps) Usage(now time.Time) iter.Seq[Usage] {
	return func(yield func(Usage) bool) {
		// The default cap's scope, then each override window size's once.
		seen := map[*window.Scope]bool{}
		for _, l := range append([]limit{c.def}, c.overrideLimits()...) {
			if seen[l.scope] {
				continue
			}
			seen[l.scope] = true
			for u := range c.counter.Usage(l.scope) {
				cur := c.limitFor(u.Key)
				if cur.scope.Name != u.Scope || cur.scope.Window != u.Window {
					continue // counted under another cap before a reload
				}
				if !yield(c.row(u.Key, cur, u.Count, u.End, now, false)) {
					return
				}
			}
		}
		for u := range c.counter.Usage(c.overflow.scope) {
			if !yield(c.row(OverflowQuota, c.overflow, u.Count, u.End, now, true)) {
				return
			}
		}
	}
}

// limitFor is limitOf for a tenant named by a string.
func (c *Caps) limitFor(tenant string) limit {
	if o, ok := c.overrides[tenant]; ok {
		return o
	}
	return c.def
}

func (c *Caps) overrideLimits() []limit {
	out := make([]limit, 0, len(c.overrides))
	for _, l := range c.overrides {
		out = append(out, l)
	}
	return out
}

// Lookup returns tenant's window on this listener, when it has counted
// something in the current one. A tenant counted in the overflow window
// has none of its own.
func (c *Caps) Lookup(tenant string, now time.Time) (Usage, bool) {
	l := c.limitFor(tenant)
	if l.rate <= 0 {
		return Usage{}, false // not counted
	}
	d := c.counter.Peek(l.scope, []byte(tenant), l.rate)
	if d.Count == 0 || d.Unavailable {
		return Usage{}, false
	}
	return c.row(tenant, l, d.Count, d.End(), now, false), true
}

func (c *Caps) row(tenant string, l limit, count int64, end, now time.Time, overflow bool) Usage {
	return Usage{
		Listener: c.listener, Tenant: tenant, Limit: l.rate, Window: int(l.scope.Window),
		Count: count, Remaining: max(l.rate-count, 0), ExpiresInSeconds: end.Sub(now).Seconds(),
		Overflow: overflow,
	}
}
