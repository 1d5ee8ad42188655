package respond

import (
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/control"
	"github.com/warden-dev/warden/governor/tenant"
	"github.com/warden-dev/warden/governor/window"
	"github.com/warden-dev/warden/policy"
)

// TestTenant: the tenant cap's 429 carries the RateLimit fields of the
// window it counted in; a refusal made because a fail_closed backend is
// down counted nothing and carries none.
func TestTenant(t *testing.T) {
	now := time.Date(2026, 3, 2, 10, 0, 20, 0, time.UTC)
	caps := tenant.New("ingress", &policy.TenantCap{Header: "x-tenant-id", Rate: 2, Window: 60}, nil, window.NewMemory(clock.NewFake(now)), nil)
	var over tenant.Result
	for range 3 {
		over = caps.Check([]byte("acme"), now)
	}
	down := tenant.Result{Decision: window.Decision{Unavailable: true, Limit: 2}, Tenant: []byte("acme"), Window: 60}
	cases := []struct {
		name    string
		r       tenant.Result
		control string
		headers map[string]string // "" means absent
		body    string
	}{
		{"over the cap", over, "tenant_rate",
			map[string]string{"Retry-After": "40", "RateLimit-Limit": "2", "RateLimit-Remaining": "0", "RateLimit-Reset": "40"},
			`{"control":"tenant_rate","quota":"tenant:acme","limit":2,"current":3,"retryAfterSeconds":40}`},
		{"backend down, fail_closed", down, "upstream",
			map[string]string{"Retry-After": "1", "RateLimit-Limit": "", "RateLimit-Remaining": "", "RateLimit-Reset": ""},
			`{"control":"upstream","quota":"tenant:acme","limit":2,"retryAfterSeconds":1}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var ctx fasthttp.RequestCtx
			Tenant(&ctx, tc.r, now)
			h := &ctx.Response.Header
			if ctx.Response.StatusCode() != 429 || string(h.Peek(control.Header)) != tc.control {
				t.Fatalf("status %d, control %q; want 429, %q", ctx.Response.StatusCode(), h.Peek(control.Header), tc.control)
			}
			for k, want := range tc.headers {
				if got := string(h.Peek(k)); got != want {
					t.Errorf("%s: %q, want %q", k, got, want)
				}
			}
			if got := string(ctx.Response.Body()); got != tc.body {
				t.Errorf("body %s, want %s", got, tc.body)
			}
		})
	}
}
