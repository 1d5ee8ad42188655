package governor

import (
	"fmt"
	"slices"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/warden-dev/warden/governor/breaker"
	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/metrics"
	"github.com/warden-dev/warden/governor/pool"
	"github.com/warden-dev/warden/governor/window"
	"github.com/warden-dev/warden/policy"
)

func mustParse(t *testing.T, src string) *policy.Policy {
	t.Helper()
	p, err := policy.Parse("test.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

const pol = `version: 1
egress:
  http_listen: 127.0.0.1:0
  tenant: { rate: 2, window: 60 }
pools:
  shared: { concurrency: 1 }
targets:
  - name: a
    hosts: [a.example]
    circuit_breaker: { enabled: true, minimum_requests: 2, failure_ratio: 0.5 }
    pools: [shared]
  - name: b
    hosts: [b.example]
    circuit_breaker: { enabled: true, minimum_requests: %d }
`

func TestApplyCarriesStateOfUnchangedControls(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 5, 12, 0, 0, 0, time.UTC))
	g := New(clk, nil, window.NewMemory(clk))
	c1 := g.Apply(mustParse(t, fmt.Sprintf(pol, 2)))
	for i := 0; i < 2; i++ {
		tk, _, _ := c1.Targets["a"].Breaker.Allow()
		tk.Done(breaker.Failure)
	}
	if c1.Targets["a"].Breaker.State() != breaker.Open {
		t.Fatal("breaker a did not open")
	}
	c1.EgressCaps.Check([]byte("acme"), clk.Now())

	c2 := g.Apply(mustParse(t, fmt.Sprintf(pol, 7)))
	if c2.Targets["a"].Breaker != c1.Targets["a"].Breaker || c2.Targets["a"].Breaker.State() != breaker.Open {
		t.Fatal("unchanged target a lost its breaker state on reload")
	}
	if c2.Targets["b"].Breaker == c1.Targets["b"].Breaker {
		t.Fatal("changed breaker settings of b were not applied")
	}
	if c2.Targets["a"].Pools[0] != c1.Pools.Get("shared") {
		t.Fatal("target a's pool is not the surviving pool")
	}
	if u, _ := c2.Tenants(10, nil, clk.Now()); len(u) != 1 || u[0].Count != 1 {
		t.Fatalf("tenant window lost on reload: %+v", u)
	}
	if g.Current() != c2 {
		t.Fatal("Current is not the last applied controls")
	}
}

const sharedPol = `version: 1
egress: { http_listen: 127.0.0.1:0 }
targets:
  - { name: a, hosts: [a.example], upstream: "http://api.example:8080", circuit_breaker: { enabled: true, minimum_requests: 2 } }
  - { name: b, hosts: [b.example], upstream: "%s", circuit_breaker: { enabled: true, minimum_requests: 2 } }
`

// TestTargetsSharingAHostShareABreaker: SPEC §4's "HTTP targets sharing a
// host share a breaker", across reloads, in GET /v1/breakers and in the
// state gauge of each target.
func TestTargetsSharingAHostShareABreaker(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 5, 12, 0, 0, 0, time.UTC))
	m := metrics.New()
	g := New(clk, m, window.NewMemory(clk))
	c1 := g.Apply(mustParse(t, fmt.Sprintf(sharedPol, "http://api.example:8080")))
	if c1.Targets["a"].Breaker != c1.Targets["b"].Breaker {
		t.Fatal("a and b send to api.example:8080 but have breakers of their own")
	}
	for range 2 {
		tk, _, _ := c1.Targets["b"].Breaker.Allow()
		tk.Done(breaker.Failure)
	}
	if _, _, ok := c1.Targets["a"].Breaker.Allow(); ok {
		t.Fatal("b's failures did not open the breaker a fails fast on")
	}
	gauge := func(target string) float64 {
		if _, err := m.Gather(); err != nil { // as a scrape does
			t.Fatal(err)
		}
		var d dto.Metric
		if err := m.BreakerState.WithLabelValues(target).Write(&d); err != nil {
			t.Fatal(err)
		}
		return d.GetGauge().GetValue()
	}
	if gauge("a") != 2 || gauge("b") != 2 {
		t.Fatalf("warden_breaker_state a=%v b=%v, want 2 (open) for both", gauge("a"), gauge("b"))
	}
	snaps := c1.BreakerSnapshots()
	if len(snaps) != 2 || snaps[0].Target != "a" || snaps[1].Target != "b" || snaps[1].State != "open" {
		t.Fatalf("breaker snapshots %+v", snaps)
	}

	// Unchanged, the shared breaker stays open for both.
	c2 := g.Apply(mustParse(t, fmt.Sprintf(sharedPol, "http://api.example:8080")))
	if c2.Targets["b"].Breaker != c1.Targets["a"].Breaker || c2.Targets["a"].Breaker != c1.Targets["a"].Breaker {
		t.Fatal("a reload with nothing changed replaced the shared breaker")
	}
	// b moves to another host: it gets a breaker of its own, closed, and a
	// keeps the open one; neither keeps sharing by way of its old state.
	c3 := g.Apply(mustParse(t, fmt.Sprintf(sharedPol, "http://other.example:8080")))
	if c3.Targets["a"].Breaker != c1.Targets["a"].Breaker || c3.Targets["b"].Breaker == c3.Targets["a"].Breaker {
		t.Fatal("after b moved host, a should keep the shared breaker and b have its own")
	}
	if c3.Targets["b"].Breaker.State() != breaker.Closed || gauge("b") != 0 || gauge("a") != 2 {
		t.Fatalf("b %v (gauge %v), a gauge %v: want b closed and a open", c3.Targets["b"].Breaker.State(), gauge("b"), gauge("a"))
	}
	// The kept breaker's state changes no longer move b's gauge.
	c3.Targets["a"].Breaker.Reset()
	tk, _, _ := c3.Targets["b"].Breaker.Allow()
	tk.Done(breaker.Failure)
	tk, _, _ = c3.Targets["b"].Breaker.Allow()
	tk.Done(breaker.Failure)
	if gauge("a") != 0 || gauge("b") != 2 {
		t.Fatalf("gauges a=%v b=%v, want 0 and 2", gauge("a"), gauge("b"))
	}
}

// The breaker leaves open lazily, on the next call; a scrape after its
// open time must already show it half-open, as GET /v1/breakers does.
func TestBreakerGaugeShowsHalfOpenWhenScraped(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 5, 12, 0, 0, 0, time.UTC))
	m := metrics.New()
	g := New(clk, m, window.NewMemory(clk))
	c := g.Apply(mustParse(t, fmt.Sprintf(pol, 2)))
	for range 2 {
		tk, _, _ := c.Targets["a"].Breaker.Allow()
		tk.Done(breaker.Failure)
	}
	scraped := func() float64 {
		fams, err := m.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			if f.GetName() != "warden_breaker_state" {
				continue
			}
			for _, mt := range f.GetMetric() {
				if mt.GetLabel()[0].GetValue() == "a" {
					return mt.GetGauge().GetValue()
				}
			}
		}
		t.Fatal("no warden_breaker_state{target=a}")
		return 0
	}
	if v := scraped(); v != 2 {
		t.Fatalf("open breaker scraped as %v, want 2", v)
	}
	clk.Advance(6 * time.Second) // past the default open of 5 s
	if v, s := scraped(), c.BreakerSnapshots()[0].State; v != 1 || s != "half_open" {
		t.Fatalf("after its open time: gauge %v, /v1/breakers %q; want 1 and half_open", v, s)
	}
}

const leasePol = `version: 1
egress: { http_listen: 127.0.0.1:0 }
targets:
  - { name: a, hosts: [a.example], upstream: "http://api.example:8080", timeout: 30s,
      circuit_breaker: { enabled: true, minimum_requests: 1, open: 1s, max_open: 1s } }
  - { name: b, hosts: [b.example], upstream: "http://api.example:8080", timeout: %s,
      circuit_breaker: { enabled: true, minimum_requests: 1, open: 1s, max_open: 1s } }
`

// TestProbeLeaseFollowsTheTimeout: a half-open probe may take as long as
// the longest timeout of the targets sharing its breaker, far past
// max_open, and nobody else is let through meanwhile; a target without a
// timeout leaves the probe unbounded.
func TestProbeLeaseFollowsTheTimeout(t *testing.T) {
	cases := []struct {
		bTimeout string
		second   time.Duration // when a second probe is first let through; 0: never
	}{
		{"5s", 31 * time.Second},
		{"45s", 46 * time.Second},
		{"0s", 0},
	}
	for _, tc := range cases {
		t.Run("b timeout "+tc.bTimeout, func(t *testing.T) {
			clk := clock.NewFake(time.Date(2026, 1, 5, 12, 0, 0, 0, time.UTC))
			g := New(clk, nil, window.NewMemory(clk))
			c := g.Apply(mustParse(t, fmt.Sprintf(leasePol, tc.bTimeout)))
			b := c.Targets["a"].Breaker
			tk, _, _ := b.Allow()
			tk.Done(breaker.Failure)
			clk.Advance(time.Second)
			if _, _, ok := b.Allow(); !ok {
				t.Fatal("no probe after open")
			}
			limit := tc.second
			if limit == 0 {
				limit = time.Hour
			}
			for elapsed := time.Duration(0); elapsed < limit; elapsed += time.Second {
				if _, _, ok := b.Allow(); ok {
					t.Fatalf("a second probe was let through %v after the first", elapsed)
				}
				clk.Advance(time.Second)
			}
			if _, _, ok := b.Allow(); ok != (tc.second != 0) {
				t.Fatalf("at %v a second probe let through: %v, want %v", limit, ok, tc.second != 0)
			}
		})
	}
}

// TestPoolCountGaugeFollowsTheWindow: warden_pool_window_count, as
// scraped, is the current window's count: 0 once the window has ended, and
// one less after a refund, though no admission has set it since.
func TestPoolCountGaugeFollowsTheWindow(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 5, 12, 0, 0, 0, time.UTC))
	m := metrics.New()
	g := New(clk, m, window.NewMemory(clk))
	c := g.Apply(mustParse(t, "version: 1\npools:\n  g: { rate: 3, window: 1 }\n"))
	p := c.Pools.Get("g")
	gauge := func() float64 {
		if _, err := m.Gather(); err != nil { // as a scrape does
			t.Fatal(err)
		}
		var d dto.Metric
		if err := m.PoolWindowCount.WithLabelValues("g").Write(&d); err != nil {
			t.Fatal(err)
		}
		return d.GetGauge().GetValue()
	}
	var last pool.Lease
	for range 3 {
		l, _, ok := p.TryAcquire(clk.Now())
		if !ok {
			t.Fatal("refused within the rate")
		}
		last = l
	}
	if got := gauge(); got != 3 {
		t.Fatalf("after 3 admissions the gauge reads %v", got)
	}
	last.Refund()
	if got := gauge(); got != 2 {
		t.Fatalf("after a refund the gauge reads %v, want 2", got)
	}
	clk.Advance(2 * time.Second)
	if got := gauge(); got != 0 {
		t.Fatalf("after the window ended the gauge reads %v, want 0", got)
	}
}

// A target whose breaker is not enabled has no breaker to report: listed
// as "closed" in /v1/breakers, or as 0 in warden_breaker_state, it could
// not be told from a working one. A reload that disables one removes it.
func TestDisabledBreakerIsNotReported(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	m := metrics.New()
	g := New(clk, m, window.NewMemory(clk))
	const pol = `version: 1
egress: { http_listen: 127.0.0.1:0 }
targets:
  - { name: guarded, hosts: [g.example], circuit_breaker: { enabled: %s } }
  - { name: plain, hosts: [p.example] }
`
	gauges := func() []string {
		fams, err := m.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, f := range fams {
			if f.GetName() == "warden_breaker_state" {
				for _, mt := range f.GetMetric() {
					got = append(got, mt.GetLabel()[0].GetValue())
				}
			}
		}
		return got
	}
	tests := []struct {
		enabled string
		want    []string
	}{
		{"true", []string{"guarded"}},
		{"false", nil},
	}
	for _, tc := range tests {
		c := g.Apply(mustParse(t, fmt.Sprintf(pol, tc.enabled)))
		var listed []string
		for _, s := range c.BreakerSnapshots() {
			listed = append(listed, s.Target)
		}
		if !slices.Equal(listed, tc.want) {
			t.Errorf("enabled %s: /v1/breakers lists %v, want %v", tc.enabled, listed, tc.want)
		}
		if got := gauges(); !slices.Equal(got, tc.want) {
			t.Errorf("enabled %s: warden_breaker_state for %v, want %v", tc.enabled, got, tc.want)
		}
	}
}
