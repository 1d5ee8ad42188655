package tenant

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warden-dev/warden/governor/backend/redisx"
	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/control"
	"github.com/warden-dev/warden/governor/window"
	"github.com/warden-dev/warden/policy"
)

var t0 = time.Date(2026, 1, 5, 12, 0, 0, 300e6, time.UTC)

func newCaps(clk clock.Clock) *Caps {
	return New("ingress",
		&policy.TenantCap{Header: "x-tenant-id", Rate: 3, Window: 1},
		map[string]policy.Limit{"acme": {Rate: 5, Window: 60}},
		window.NewMemory(clk), nil)
}

func TestCaps(t *testing.T) {
	tests := []struct {
		name     string
		tenant   string
		admitted int
		quota    string
		limit    int64
	}{
		{"default cap", "globex", 3, "tenant:globex", 3},
		{"override", "acme", 5, "tenant:acme", 5},
		{"missing header counts in the expression bucket", "", 3, "tenant:header:x-tenant-id", 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewFake(t0)
			c := newCaps(clk)
			n := 0
			var last Result
			for i := 0; i < 20; i++ {
				last = c.Check([]byte(tc.tenant), clk.Now())
				if last.Allowed {
					n++
				}
			}
			if n != tc.admitted {
				t.Fatalf("admitted %d, want %d", n, tc.admitted)
			}
			if last.Quota() != tc.quota || last.Limit != tc.limit {
				t.Fatalf("quota %q limit %d, want %q %d", last.Quota(), last.Limit, tc.quota, tc.limit)
			}
		})
	}
}

func TestTenantsDoNotShare(t *testing.T) {
	clk := clock.NewFake(t0)
	c := newCaps(clk)
	for i := 0; i < 3; i++ {
		c.Check([]byte("a"), clk.Now())
	}
	if !c.Check([]byte("b"), clk.Now()).Allowed {
		t.Fatal("tenant b refused because tenant a used its cap")
	}
	if !c.Check(nil, clk.Now()).Allowed {
		t.Fatal("unnamed bucket refused because tenant a used its cap")
	}
}

func TestRejectionBody(t *testing.T) {
	clk := clock.NewFake(t0)
	c := newCaps(clk)
	var r Result
	for i := 0; i < 6; i++ {
		r = c.Check([]byte("acme"), clk.Now())
	}
	if r.Allowed {
		t.Fatal("6th acme request admitted at rate 5")
	}
	body := refusalBody(r, clk.Now())
	want := `{"control":"tenant_rate","quota":"tenant:acme","limit":5,"current":6,"retryAfterSeconds":60}`
	if string(body) != want {
		t.Fatalf("body %s\nwant %s", body, want)
	}
	var v map[string]any
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("body is not JSON: %v", err)
	}
	if got := r.Remaining(); got != 0 {
		t.Fatalf("remaining %d", got)
	}
}

// A tenant header may carry any byte (Latin-1, control characters); the
// 429 body must stay JSON whatever the tenant is called.
func TestRejectionBodyIsJSONForAnyTenant(t *testing.T) {
	for _, tenant := range []string{"caf\xe9", "bell\a", "del\x7f", "quote\"back\\", "\U000f0000"} {
		clk := clock.NewFake(t0)
		c := newCaps(clk)
		var r Result
		for i := 0; i < 6; i++ {
			r = c.Check([]byte(tenant), clk.Now())
		}
		for _, unavailable := range []bool{false, true} {
			r.Unavailable = unavailable
			body := refusalBody(r, clk.Now())
			var v struct{ Quota string }
			if err := json.Unmarshal(body, &v); err != nil {
				t.Errorf("tenant %q (unavailable %v): body %s is not JSON: %v", tenant, unavailable, body, err)
				continue
			}
			if want := strings.ToValidUTF8("tenant:"+tenant, "\ufffd"); v.Quota != want {
				t.Errorf("tenant %q: quota %q, want %q", tenant, v.Quota, want)
			}
		}
	}
}

func TestRetryAfterIsWholeSecondsAtLeastOne(t *testing.T) {
	tests := []struct {
		at   time.Time
		want int
	}{
		{t0, 1},                             // 0.7 s left of a 1 s window
		{t0.Add(699 * time.Millisecond), 1}, // 1 ms left
		{time.Date(2026, 1, 5, 12, 0, 0, 0, time.UTC), 1}, // exactly on the boundary
	}
	for _, tc := range tests {
		clk := clock.NewFake(tc.at)
		c := newCaps(clk)
		r := c.Check([]byte("x"), clk.Now())
		if got := r.RetryAfter(clk.Now()); got != tc.want {
			t.Errorf("at %v RetryAfter = %d, want %d", tc.at, got, tc.want)
		}
	}
}

func TestUsage(t *testing.T) {
	clk := clock.NewFake(t0)
	c := newCaps(clk)
	c.Check([]byte("acme"), clk.Now())
	c.Check([]byte("globex"), clk.Now())
	c.Check([]byte("globex"), clk.Now())
	got := map[string]Usage{}
	for u := range c.Usage(clk.Now()) {
		got[u.Tenant] = u
	}
	if u := got["acme"]; u.Count != 1 || u.Limit != 5 || u.Window != 60 || u.Remaining != 4 {
		t.Fatalf("acme usage %+v", u)
	}
	if u := got["globex"]; u.Count != 2 || u.Limit != 3 || u.Window != 1 {
		t.Fatalf("globex usage %+v", u)
	}
}

func BenchmarkCheck100kTenants(b *testing.B) {
	c := New("ingress", &policy.TenantCap{Header: "x-tenant-id", Rate: 1 << 30, Window: 60},
		map[string]policy.Limit{"acme": {Rate: 500, Window: 1}}, window.NewMemory(clock.Real{}), nil)
	keys := make([][]byte, 100_000)
	for i := range keys {
		keys[i] = []byte("tenant-" + strconv.Itoa(i))
	}
	now := time.Now()
	for _, k := range keys { // warm: every tenant has a live window
		c.Check(k, now)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i&1023 == 0 {
			now = time.Now()
		}
		c.Check(keys[i%len(keys)], now)
	}
}

func BenchmarkCheck100kTenantsParallel(b *testing.B) {
	c := New("ingress", &policy.TenantCap{Header: "x-tenant-id", Rate: 1 << 30, Window: 60},
		nil, window.NewMemory(clock.Real{}), nil)
	keys := make([][]byte, 100_000)
	for i := range keys {
		keys[i] = []byte("tenant-" + strconv.Itoa(i))
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		now := time.Now()
		i := 0
		for pb.Next() {
			if i&1023 == 0 {
				now = time.Now()
			}
			c.Check(keys[i%len(keys)], now)
			i += 7
		}
	})
}

// A fail_closed backend outage is reported as control upstream, with a
// one-second retry hint rather than the window's end.
func TestBackendDownReportsUpstream(t *testing.T) {
	clk := clock.NewFake(t0)
	down, err := window.NewRedis(window.RedisConfig{Config: redisx.Config{URL: "redis://127.0.0.1:1/0", FailClosed: true}}, clk, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	c := New("ingress", &policy.TenantCap{Header: "x-tenant-id", Rate: 500, Window: 60}, nil, down, nil)
	r := c.Check([]byte("acme"), clk.Now())
	if r.Allowed || r.Control() != control.Upstream || r.RetryAfter(clk.Now()) != 1 {
		t.Fatalf("result %+v control %q retry %d", r, r.Control(), r.RetryAfter(clk.Now()))
	}
	want := `{"control":"upstream","quota":"tenant:acme","limit":500,"retryAfterSeconds":1}`
	if got := string(refusalBody(r, clk.Now())); got != want {
		t.Fatalf("body %s, want %s", got, want)
	}
	if ok := New("ingress", &policy.TenantCap{Header: "x-tenant-id", Rate: 500, Window: 60}, nil, window.NewMemory(clk), nil).Check([]byte("acme"), clk.Now()); ok.Control() != control.TenantRate {
		t.Fatalf("memory control %q", ok.Control())
	}
}

// TestRateZeroDisables: rate 0 turns a tenant's gate off instead of
// refusing every request.
func TestRateZeroDisables(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 5, 12, 0, 17, 0, time.UTC))
	caps := New("ingress", &policy.TenantCap{Header: "x-tenant-id", Rate: 0, Window: 1},
		map[string]policy.Limit{"acme": {Rate: 1, Window: 1}}, window.NewMemory(clk), nil)
	for range 100 {
		if r := caps.Check([]byte("globex"), clk.Now()); !r.Allowed {
			t.Fatal("rate 0 refused a request")
		}
	}
	if r := caps.Check([]byte("acme"), clk.Now()); !r.Allowed {
		t.Fatal("acme's override refused its first request")
	}
	if r := caps.Check([]byte("acme"), clk.Now()); r.Allowed {
		t.Fatal("acme's override of 1 admitted a second request")
	}
}

// refusalBody is the 429 body the listeners send for r.
func refusalBody(r Result, now time.Time) []byte {
	ref := r.Refusal(now)
	return ref.AppendBody(nil)
}
