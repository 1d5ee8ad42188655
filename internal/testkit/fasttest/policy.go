package fasttest

import (
	"testing"

	"github.com/warden-dev/warden/governor"
	"github.com/warden-dev/warden/governor/backend/redisx"
	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/metrics"
	"github.com/warden-dev/warden/governor/window"
	"github.com/warden-dev/warden/policy"
)

// Governor is a governor with its metrics, for components under test.
type Governor struct {
	*governor.Governor
	Metrics *metrics.Metrics
}

// NewGovernor builds a governor on clk and applies the policy text.
func NewGovernor(t testing.TB, clk clock.Clock, yaml string) (*Governor, *governor.Controls) {
	t.Helper()
	m := metrics.New()
	g := &Governor{Governor: governor.New(clk, m, window.NewMemory(clk)), Metrics: m}
	return g, g.Load(t, yaml)
}

// Load applies another policy text, as a reload would.
func (g *Governor) Load(t testing.TB, yaml string) *governor.Controls {
	t.Helper()
	p, err := policy.Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatalf("policy:\n%v\n%s", err, yaml)
	}
	return g.Apply(p)
}

// NewGovernorBackendDown is NewGovernor with its windows counted in a
// fail_closed Redis that cannot be reached: port 1 on loopback refuses
// connections, a real outage rather than a mock of one.
func NewGovernorBackendDown(t testing.TB, clk clock.Clock, yaml string) (*Governor, *governor.Controls) {
	t.Helper()
	down, err := window.NewRedis(window.RedisConfig{Config: redisx.Config{URL: "redis://127.0.0.1:1/0", FailClosed: true}}, clk, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { down.Close() })
	m := metrics.New()
	g := &Governor{Governor: governor.New(clk, m, down), Metrics: m}
	return g, g.Load(t, yaml)
}
