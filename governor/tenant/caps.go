// Package tenant implements per-tenant request caps (SPEC §4): a fixed-window
// count of requests per tenant, where the tenant comes from a header and a
// request without one is counted in a bucket named after the header, never
// exempt. The tenants a window counts apart are capped (tenant.max_keys,
// SPEC §12): the header is the client's to choose, so beyond the cap new
// tenants share one overflow window. See README.md.
package tenant

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/warden-dev/warden/governor/control"
	"github.com/warden-dev/warden/governor/metrics"
	"github.com/warden-dev/warden/governor/window"
	"github.com/warden-dev/warden/policy"
)

// OverflowQuota names the overflow window in 429 bodies and listings: the
// window tenants first seen beyond max_keys share.
const OverflowQuota = "tenant_overflow"

// Caps is one listener's tenant caps. It is built per policy and read-only
// afterwards; counts live in the shared window.Counter so they survive reloads.
//
// Three kinds of window, each in a scope of its own so that no tenant's
// name can reach another kind's: the default cap's, one per tenant and at
// most max_keys per window ("tenant:LISTENER"); the overrides' ("tenant_
// override:LISTENER"), which the policy bounds and the cap leaves alone;
// and the one overflow window, at the default rate
// ("tenant_overflow:LISTENER").
type Caps struct {
	listener  string
	header    string
	def       limit
	overflow  limit
	overrides map[string]limit
	bucket    []byte
	counter   window.Counter
	// overflowed counts requests sent to the overflow window (nil: no
	// metrics).
	overflowed prometheus.Counter
}

type limit struct {
	rate  int64
	scope *window.Scope
}

// overflowKey is the overflow window's key in its scope.
var overflowKey = []byte(OverflowQuota)

// New builds the caps of listener ("ingress", "egress") from its policy
// section. It returns nil when cap is nil: no tenant cap on that listener.
// cap.MaxKeys 0 leaves the default cap's tenants uncapped (the policy
// package always sets it). m may be nil.
func New(listener string, cap *policy.TenantCap, overrides map[string]policy.Limit, c window.Counter, m *metrics.Metrics) *Caps {
	if cap == nil {
		return nil
	}
	def := window.NewScope("tenant:"+listener, cap.Window)
	def.MaxKeys = cap.MaxKeys
	caps := &Caps{
		listener:  listener,
		header:    cap.Header,
		def:       limit{rate: int64(cap.Rate), scope: def},
		overflow:  limit{rate: int64(cap.Rate), scope: window.NewScope("tenant_overflow:"+listener, cap.Window)},
		overrides: make(map[string]limit, len(overrides)),
		bucket:    []byte("header:" + cap.Header),
		counter:   c,
	}
	if m != nil {
		caps.overflowed = m.TenantOverflow.WithLabelValues(listener)
	}
	scopes := map[policy.Window]*window.Scope{}
	for name, l := range overrides {
		s := scopes[l.Window]
		if s == nil {
			s = window.NewScope("tenant_override:"+listener, l.Window)
			scopes[l.Window] = s
		}
		caps.overrides[name] = limit{rate: int64(l.Rate), scope: s}
	}
	return caps
}

// Header is the request header that names the tenant.
func (c *Caps) Header() string { return c.header }

// Result is the outcome of one Check.
type Result struct {
	window.Decision
	// Tenant is the tenant the request named: the header's value, or the
	// expression bucket when the header was absent. It aliases the caller's
	// bytes or the Caps' own; copy it to keep it.
	Tenant []byte
	Window policy.Window
	// Overflowed says the request was counted in the overflow window: its
	// tenant was first seen in a window already holding max_keys tenants.
	// The Decision is then the overflow window's.
	Overflowed bool
}

// Check counts one request for tenant (the header's value; empty when the
// request carries none) at now.
func (c *Caps) Check(tenant []byte, now time.Time) (r Result) {
	if len(tenant) == 0 {
		tenant = c.bucket
	}
	l := c.limitOf(tenant)
	if l.rate <= 0 {
		// rate 0 turns the gate off (policy/REFERENCE.md): admit without
		// counting rather than refuse everything.
		return Result{Decision: window.Decision{Allowed: true}, Tenant: tenant, Window: l.scope.Window}
	}
	r.Decision = c.counter.Take(l.scope, tenant, l.rate, 1, now)
	r.Tenant, r.Window = tenant, l.scope.Window
	if r.Overflow {
		r.Decision = c.counter.Take(c.overflow.scope, overflowKey, c.overflow.rate, 1, now)
		r.Overflowed = true
		if c.overflowed != nil {
			c.overflowed.Inc()
		}
	}
	return r
}

// limitOf is the cap tenant is counted under: its override, or the
// default.
func (c *Caps) limitOf(tenant []byte) limit {
	if len(c.overrides) > 0 {
		if o, ok := c.overrides[string(tenant)]; ok {
			return o
		}
	}
	return c.def
}

// Control names what refused the request: tenant_rate, or upstream when
// the shared backend was unreachable (Decision.Unavailable).
func (r Result) Control() control.Name {
	if r.Unavailable {
		return control.Upstream
	}
	return control.TenantRate
}

// RetryAfter is the whole number of seconds, at least 1, until the tenant's
// window ends; 1 when the backend was unreachable (an outage has no known
// end, and the window's end would be a wrong promise).
func (r Result) RetryAfter(now time.Time) int {
	if r.Unavailable {
		return 1
	}
	return int(control.RetryAfterSeconds(r.ResetIn(now)))
}

// Quota names the refused quota the way the 429 body does: "tenant:acme",
// or "tenant_overflow" for the overflow window (which no tenant's quota
// can be: theirs all start "tenant:").
func (r Result) Quota() string {
	if r.Overflowed {
		return OverflowQuota
	}
	return "tenant:" + string(r.Tenant)
}

// Refusal is SPEC §4's tenant 429:
// {"control":"tenant_rate","quota":"tenant:acme","limit":500,"current":501,"retryAfterSeconds":1}
// with Retry-After and the RateLimit fields ("quota":"tenant_overflow"
// when the overflow window refused). current counts the refused request,
// which the window itself never does. When the backend was unreachable
// (fail_closed) nothing was counted: no current and no RateLimit fields,
// {"control":"upstream","quota":"tenant:acme","limit":500,"retryAfterSeconds":1}.
func (r Result) Refusal(now time.Time) control.Refusal {
	ref := control.Refusal{Control: r.Control(), Quota: r.Quota(), Limit: r.Limit, RetryAfter: int64(r.RetryAfter(now))}
	if !r.Unavailable {
		ref.Counted, ref.Current, ref.Remaining = true, r.Count+1, r.Remaining()
	}
	return ref
}
