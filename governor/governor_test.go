package governor

import (
	"fmt"
	"testing"
	"time"

	"github.com/warden-dev/warden/governor/breaker"
	"github.com/warden-dev/warden/governor/clock"
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
	if u := c2.TenantUsage(clk.Now()); len(u) != 1 || u[0].Count != 1 {
		t.Fatalf("tenant window lost on reload: %+v", u)
	}
	if g.Current() != c2 {
		t.Fatal("Current is not the last applied controls")
	}
}
