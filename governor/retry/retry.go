// Package retry is warden's retry policy (SPEC §4): the backoff delay, the
// non_retryable filter and the retry budget, shared by egress (idempotent
// requests) and the scheduler (run failures).
//
// A Policy decides; it never sleeps or re-sends. Callers ask ShouldRetry
// after a failure, wait Delay on their own clock, and report first attempts
// with RecordExecution so the budget knows the traffic it is a ratio of.
package retry

import (
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/control"
	"github.com/warden-dev/warden/policy"
)

// Policy is one retry policy with its own budget and random source. It is
// safe for concurrent use.
type Policy struct {
	count        int
	logic        string
	delay        float64 // ns
	scale        float64
	maxDelay     float64 // ns; +Inf when uncapped
	jitter       float64
	nonRetryable []string
	budget       *Budget // nil when disabled

	rndMu sync.Mutex
	rnd   func() float64
}

// Option customises New.
type Option func(*options)

type options struct {
	clk  clock.Clock
	rnd  func() float64
	seed *uint64
}

// WithClock sets the clock the budget window runs on (default: real).
func WithClock(c clock.Clock) Option { return func(o *options) { o.clk = c } }

// WithRand makes Delay draw jitter from f, which must return values in
// [0, 1). The policy serialises calls to f.
func WithRand(f func() float64) Option { return func(o *options) { o.rnd = f } }

// WithSeed seeds the policy's own PCG source, for reproducible jitter.
func WithSeed(seed uint64) Option { return func(o *options) { o.seed = &seed } }

// New builds the policy for cfg (defaults already filled in by the policy
// loader).
//
// max_delay ≤ 0 means uncapped. budget ≥ 1 disables the budget (SPEC §4;
// it is also the loader's default). budget 0 is taken literally: retries
// only while the window holds fewer than MinExecutions executions.
func New(cfg policy.Retry, opts ...Option) *Policy {
	o := options{clk: clock.Real{}}
	for _, f := range opts {
		f(&o)
	}
	p := &Policy{
		count:    cfg.Count,
		logic:    cfg.Logic,
		delay:    float64(cfg.Delay),
		scale:    cfg.Scale,
		maxDelay: math.Inf(1),
		jitter:   cfg.Jitter,
		rnd:      o.rnd,
	}
	if cfg.MaxDelay > 0 {
		p.maxDelay = float64(cfg.MaxDelay)
	}
	for _, s := range cfg.NonRetryable {
		// An empty entry is a substring of everything and would silently
		// make every failure terminal.
		if s != "" {
			p.nonRetryable = append(p.nonRetryable, s)
		}
	}
	if p.rnd == nil {
		var seed uint64
		if o.seed != nil {
			seed = *o.seed
		} else {
			seed = rand.Uint64()
		}
		p.rnd = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)).Float64
	}
	if cfg.Budget < 1 {
		p.budget = NewBudget(max(cfg.Budget, 0), o.clk)
	}
	return p
}

// Count is the maximum number of retries after the first attempt.
func (p *Policy) Count() int { return p.count }

// Budget returns the policy's retry budget, or nil when it is disabled.
func (p *Policy) Budget() *Budget { return p.budget }

// Delay is the wait before retry number attempt (1 = before the first
// retry), per SPEC §4: the logic's base delay, capped at max_delay, jittered
// by ±jitter using rnd (a value in [0, 1); nil uses the policy's own
// source), then clamped to [0, max_delay] again so upward jitter never
// exceeds the cap. Computed in float64 so a huge attempt saturates at the
// cap instead of overflowing.
func (p *Policy) Delay(attempt int, rnd func() float64) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	d := p.delay
	switch p.logic {
	case policy.RetryLinear:
		d *= p.scale * float64(attempt)
	case policy.RetryExponential:
		d *= math.Pow(p.scale, float64(attempt-1))
	}
	d = p.clamp(d)
	if p.jitter > 0 && d > 0 {
		var r float64
		if rnd != nil {
			r = rnd()
		} else {
			p.rndMu.Lock()
			r = p.rnd()
			p.rndMu.Unlock()
		}
		d = p.clamp(d + d*p.jitter*(2*r-1))
	}
	if d >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(d)
}

// Cap bounds d by max_delay.
func (p *Policy) Cap(d time.Duration) time.Duration {
	if float64(d) > p.maxDelay {
		return time.Duration(p.maxDelay)
	}
	return d
}

// DelayAsked is Delay, lengthened to what the other side asked for (a
// Retry-After) when that is longer, but never past max_delay: the
// operator's cap on any wait holds over the peer's request too.
func (p *Policy) DelayAsked(attempt int, asked time.Duration) time.Duration {
	return max(p.Delay(attempt, nil), p.Cap(asked))
}

// clamp bounds d to [0, max_delay]. NaN (0 × Inf when delay is 0 and the
// exponent overflows) means the configured delay was 0, so it becomes 0.
func (p *Policy) clamp(d float64) float64 {
	if !(d > 0) {
		return 0
	}
	return min(d, p.maxDelay)
}

// NonRetryable reports whether reason contains any non_retryable entry.
func (p *Policy) NonRetryable(reason string) bool {
	for _, s := range p.nonRetryable {
		if strings.Contains(reason, s) {
			return true
		}
	}
	return false
}

// ShouldRetry decides whether to make retry number attempt (1-based) after
// a failure described by reason. Checks run cheapest and most final first:
// attempts left (attempt ≤ count), then non_retryable, then the budget. A
// refusal by the budget returns control.RetryBudget; the other refusals
// return "" because the failure is simply returned as is.
//
// A true result has already been charged to the budget as one retry and
// one execution: the caller must make the retry and must not also call
// RecordExecution for it.
func (p *Policy) ShouldRetry(attempt int, reason string) (ok bool, refused control.Name) {
	if attempt < 1 || attempt > p.count || p.NonRetryable(reason) {
		return false, ""
	}
	if p.budget != nil && !p.budget.TryRetry() {
		return false, control.RetryBudget
	}
	return true, ""
}

// RecordExecution counts a first attempt (not a retry) in the budget.
func (p *Policy) RecordExecution() {
	if p.budget != nil {
		p.budget.RecordExecution()
	}
}
