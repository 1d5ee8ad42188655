// Package tenant implements per-tenant request caps (SPEC §4): a fixed-window
// count of requests per tenant, where the tenant comes from a header and a
// request without one is counted in a bucket named after the header, never
// exempt.
package tenant

import (
	"strconv"
	"time"

	"github.com/warden-dev/warden/governor/window"
	"github.com/warden-dev/warden/internal/jsonstr"
	"github.com/warden-dev/warden/policy"
)

// Control is the control name tenant caps report.
const Control = "tenant_rate"

// ControlUpstream is reported instead when the shared backend is down and
// backend.on_error is fail_closed (SPEC §9): the cap was not consulted.
const ControlUpstream = "upstream"

// Caps is one listener's tenant caps. It is built per policy and read-only
// afterwards; counts live in the shared window.Counter so they survive reloads.
type Caps struct {
	listener  string
	header    string
	def       limit
	overrides map[string]limit
	bucket    []byte
	counter   window.Counter
}

type limit struct {
	rate  int64
	scope *window.Scope
}

// New builds the caps of listener ("ingress", "egress") from its policy
// section. It returns nil when cap is nil: no tenant cap on that listener.
func New(listener string, cap *policy.TenantCap, overrides map[string]policy.Limit, c window.Counter) *Caps {
	if cap == nil {
		return nil
	}
	scopes := map[policy.Window]*window.Scope{}
	scope := func(w policy.Window) *window.Scope {
		if s, ok := scopes[w]; ok {
			return s
		}
		s := window.NewScope("tenant:"+listener, w)
		scopes[w] = s
		return s
	}
	caps := &Caps{
		listener:  listener,
		header:    cap.Header,
		def:       limit{rate: int64(cap.Rate), scope: scope(cap.Window)},
		overrides: make(map[string]limit, len(overrides)),
		bucket:    []byte("header:" + cap.Header),
		counter:   c,
	}
	for name, l := range overrides {
		caps.overrides[name] = limit{rate: int64(l.Rate), scope: scope(l.Window)}
	}
	return caps
}

// Header is the request header that names the tenant.
func (c *Caps) Header() string { return c.header }

// Result is the outcome of one Check.
type Result struct {
	window.Decision
	// Tenant is the key that was counted: the header's value, or the
	// expression bucket when the header was absent. It aliases the caller's
	// bytes or the Caps' own; copy it to keep it.
	Tenant []byte
	Window policy.Window
}

// Check counts one request for tenant (the header's value; empty when the
// request carries none) at now.
func (c *Caps) Check(tenant []byte, now time.Time) (r Result) {
	if len(tenant) == 0 {
		tenant = c.bucket
	}
	l := c.def
	if len(c.overrides) > 0 {
		if o, ok := c.overrides[string(tenant)]; ok {
			l = o
		}
	}
	if l.rate <= 0 {
		// rate 0 turns the gate off (policy/REFERENCE.md): admit without
		// counting rather than refuse everything.
		return Result{Decision: window.Decision{Allowed: true}, Tenant: tenant, Window: l.scope.Window}
	}
	r.Decision = c.counter.Take(l.scope, tenant, l.rate, 1, now)
	r.Tenant, r.Window = tenant, l.scope.Window
	return r
}

// Control names what refused the request: tenant_rate, or upstream when
// the shared backend was unreachable (Decision.Unavailable).
func (r Result) Control() string {
	if r.Unavailable {
		return ControlUpstream
	}
	return Control
}

// RetryAfter is the whole number of seconds, at least 1, until the tenant's
// window ends; 1 when the backend was unreachable (an outage has no known
// end, and the window's end would be a wrong promise).
func (r Result) RetryAfter(now time.Time) int {
	if r.Unavailable {
		return 1
	}
	d := r.ResetIn(now)
	secs := int((d + time.Second - 1) / time.Second)
	if secs < 1 {
		secs = 1
	}
	return secs
}

// Quota names the refused quota the way the 429 body does: "tenant:acme".
func (r Result) Quota() string { return "tenant:" + string(r.Tenant) }

// AppendBody appends the JSON body of SPEC §4's tenant 429 to dst:
// {"control":"tenant_rate","quota":"tenant:acme","limit":500,"current":501,"retryAfterSeconds":1}.
// current counts the refused request, which the window itself never does.
// When the backend was unreachable (fail_closed) the count is unknown:
// {"control":"upstream","quota":"tenant:acme","limit":500,"retryAfterSeconds":1}.
func (r Result) AppendBody(dst []byte, now time.Time) []byte {
	if r.Unavailable {
		dst = append(dst, `{"control":"`+ControlUpstream+`","quota":`...)
		dst = jsonstr.Append(dst, r.Quota())
		dst = append(dst, `,"limit":`...)
		dst = strconv.AppendInt(dst, r.Limit, 10)
		dst = append(dst, `,"retryAfterSeconds":1}`...)
		return dst
	}
	dst = append(dst, `{"control":"`+Control+`","quota":`...)
	dst = jsonstr.Append(dst, r.Quota())
	dst = append(dst, `,"limit":`...)
	dst = strconv.AppendInt(dst, r.Limit, 10)
	dst = append(dst, `,"current":`...)
	dst = strconv.AppendInt(dst, r.Count+1, 10)
	dst = append(dst, `,"retryAfterSeconds":`...)
	dst = strconv.AppendInt(dst, int64(r.RetryAfter(now)), 10)
	return append(dst, '}')
}

// Usage is one tenant's live window, for GET /v1/tenants.
type Usage struct {
	Listener         string  `json:"listener"`
	Tenant           string  `json:"tenant"`
	Limit            int64   `json:"limit"`
	Window           int     `json:"window"`
	Count            int64   `json:"count"`
	Remaining        int64   `json:"remaining"`
	ExpiresInSeconds float64 `json:"expires_in_seconds"`
}

// Usage lists every tenant with a live window on this listener.
func (c *Caps) Usage(now time.Time) []Usage {
	seen := map[*window.Scope]bool{}
	var out []Usage
	add := func(s *window.Scope) {
		if seen[s] {
			return
		}
		seen[s] = true
		for _, u := range c.counter.Usage(s) {
			l, ok := c.overrides[u.Key]
			if !ok {
				l = c.def
			}
			if l.scope != s {
				continue // counted under another window size before a reload
			}
			rem := l.rate - u.Count
			if rem < 0 {
				rem = 0
			}
			out = append(out, Usage{
				Listener: c.listener, Tenant: u.Key, Limit: l.rate, Window: int(s.Window),
				Count: u.Count, Remaining: rem, ExpiresInSeconds: u.End.Sub(now).Seconds(),
			})
		}
	}
	add(c.def.scope)
	for _, l := range c.overrides {
		add(l.scope)
	}
	return out
}
