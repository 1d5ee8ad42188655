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
	Breaker *breaker.Breaker // disabled breakers allow everything; shared by targets sending to one host
	Retry   *retry.Policy    // nil: the target never retries
	Pools   []*pool.Pool
}

// buildTarget makes t's controls, keeping prev's breaker and retry budget
// when their settings did not change, so a reload does not close an open
// breaker or forget the retries of the last five minutes. A target that
// shares a host with an earlier one (Policy.BreakerLeaders) gets leader's
// breaker; claimed holds the breakers already kept, so that targets which
// stop sharing do not keep sharing one by way of their old state.
func (g *Governor) buildTarget(t policy.Target, prev, leader *Target, pools *pool.Set, claimed map[*breaker.Breaker]bool) *Target {
	nt := &Target{Config: t}
	switch {
	case leader != nil:
		nt.Breaker = leader.Breaker
	case prev != nil && !claimed[prev.Breaker] && reflect.DeepEqual(prev.Config.CircuitBreaker, t.CircuitBreaker):
		nt.Breaker = prev.Breaker
	default:
		cfg := policy.CircuitBreaker{}
		if t.CircuitBreaker != nil {
			cfg = *t.CircuitBreaker
		}
		nt.Breaker = breaker.New(t.Name, cfg, g.clk)
	}
	claimed[nt.Breaker] = true
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

// BreakerSnapshots lists every target's breaker for GET /v1/breakers. A
// target whose breaker is not enabled has none to list: shown "closed", it
// could not be told from one that works.
func (c *Controls) BreakerSnapshots() []breaker.Snapshot {
	out := make([]breaker.Snapshot, 0, len(c.Policy.Targets))
	for _, t := range c.Policy.Targets {
		b := c.Targets[t.Name].Breaker
		if !b.Enabled() {
			continue
		}
		s := b.Snapshot()
		// A shared breaker carries its first target's name; each row
		// names its own target.
		s.Target = t.Name
		out = append(out, s)
	}
	return out
}
