package governor

import (
	"reflect"

	"github.com/warden-dev/warden/governor/breaker"
	"github.com/warden-dev/warden/governor/pool"
	"github.com/warden-dev/warden/governor/retry"
	"github.com/warden-dev/warden/policy"
)

// Target is the controls of one egress target.
type Target struct {
	Config  policy.Target
	Breaker *breaker.Breaker // disabled breakers allow everything
	Retry   *retry.Policy    // nil: the target never retries
	Pools   []*pool.Pool
}

// buildTarget makes t's controls, keeping prev's breaker and retry budget
// when their settings did not change, so a reload does not close an open
// breaker or forget the retries of the last five minutes.
func (g *Governor) buildTarget(t policy.Target, prev *Target, pools *pool.Set) *Target {
	nt := &Target{Config: t}
	if prev != nil && reflect.DeepEqual(prev.Config.CircuitBreaker, t.CircuitBreaker) {
		nt.Breaker = prev.Breaker
	} else {
		cfg := policy.CircuitBreaker{}
		if t.CircuitBreaker != nil {
			cfg = *t.CircuitBreaker
		}
		var opts []breaker.Options
		if g.m != nil {
			gauge := g.m.BreakerState.WithLabelValues(t.Name)
			gauge.Set(0)
			opts = append(opts, breaker.Options{OnStateChange: func(_ string, _, to breaker.State) {
				gauge.Set(float64(to))
			}})
		}
		nt.Breaker = breaker.New(t.Name, cfg, g.clk, opts...)
	}
	if t.Retry != nil && t.Retry.Count > 0 {
		if prev != nil && prev.Retry != nil && reflect.DeepEqual(prev.Config.Retry, t.Retry) {
			nt.Retry = prev.Retry
		} else {
			nt.Retry = retry.New(*t.Retry, retry.WithClock(g.clk))
		}
	}
	for _, name := range t.Pools {
		if p := pools.Get(name); p != nil {
			nt.Pools = append(nt.Pools, p)
		}
	}
	return nt
}

// BreakerSnapshots lists every target's breaker for GET /v1/breakers.
func (c *Controls) BreakerSnapshots() []breaker.Snapshot {
	out := make([]breaker.Snapshot, 0, len(c.Policy.Targets))
	for _, t := range c.Policy.Targets {
		out = append(out, c.Targets[t.Name].Breaker.Snapshot())
	}
	return out
}
