package fasttest

import (
	"testing"

	"github.com/warden-dev/warden/governor"
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
