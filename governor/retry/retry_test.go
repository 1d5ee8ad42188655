package retry

import (
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/control"
	"github.com/warden-dev/warden/policy"
)

const ms = time.Millisecond

func fixedRand(v float64) func() float64 { return func() float64 { return v } }

func TestDelayByLogic(t *testing.T) {
	base := policy.Retry{Count: 5, Delay: 100 * ms, Scale: 2, MaxDelay: time.Hour}
	cases := []struct {
		logic string
		scale float64
		want  [5]time.Duration // attempts 1..5
	}{
		{policy.RetryFixed, 2, [5]time.Duration{100 * ms, 100 * ms, 100 * ms, 100 * ms, 100 * ms}},
		{policy.RetryLinear, 2, [5]time.Duration{200 * ms, 400 * ms, 600 * ms, 800 * ms, 1000 * ms}},
		{policy.RetryLinear, 1, [5]time.Duration{100 * ms, 200 * ms, 300 * ms, 400 * ms, 500 * ms}},
		{policy.RetryExponential, 2, [5]time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, 1600 * ms}},
		{policy.RetryExponential, 3, [5]time.Duration{100 * ms, 300 * ms, 900 * ms, 2700 * ms, 8100 * ms}},
		{policy.RetryExponential, 1.5, [5]time.Duration{100 * ms, 150 * ms, 225 * ms, 337500 * time.Microsecond, 506250 * time.Microsecond}},
	}
	for _, tc := range cases {
		cfg := base
		cfg.Logic, cfg.Scale = tc.logic, tc.scale
		p := New(cfg)
		for i, w := range tc.want {
			// jitter 0: deterministic whatever the random source says.
			if got := p.Delay(i+1, fixedRand(0.999)); got != w {
				t.Errorf("%s scale %v attempt %d: %v, want %v", tc.logic, tc.scale, i+1, got, w)
			}
		}
	}
}

func TestDelayCapAndJitter(t *testing.T) {
	exp := policy.Retry{Logic: policy.RetryExponential, Delay: time.Second, Scale: 2, MaxDelay: 5 * time.Second}
	withJitter := exp
	withJitter.Jitter = 0.2
	cases := []struct {
		name    string
		cfg     policy.Retry
		attempt int
		rnd     float64
		want    time.Duration
	}{
		{"under the cap", exp, 3, 0.5, 4 * time.Second},
		{"capped before jitter", exp, 4, 0.5, 5 * time.Second},
		{"jitter down from 4s", withJitter, 3, 0, 3200 * ms},
		{"jitter middle is exact", withJitter, 3, 0.5, 4 * time.Second},
		{"jitter up from 4s", withJitter, 3, 0.75, 4400 * ms},
		{"jitter up from 4.8s is capped after", func() policy.Retry { c := withJitter; c.Delay = 1200 * ms; return c }(), 3, 0.99, 5 * time.Second},
		{"jitter up at the cap stays at the cap", withJitter, 10, 0.99, 5 * time.Second},
		{"jitter down at the cap goes below", withJitter, 10, 0, 4 * time.Second},
		{"attempt 0 is treated as 1", exp, 0, 0.5, time.Second},
		{"huge exponential attempt saturates at cap", exp, 1 << 30, 0.5, 5 * time.Second},
		{"huge exponential attempt, jitter down", withJitter, math.MaxInt, 0, 4 * time.Second},
		{"huge linear attempt saturates at cap", func() policy.Retry { c := exp; c.Logic = policy.RetryLinear; return c }(), math.MaxInt, 0.5, 5 * time.Second},
		{"uncapped huge attempt saturates at MaxInt64", func() policy.Retry { c := exp; c.MaxDelay = 0; return c }(), 1 << 20, 0.5, math.MaxInt64},
		{"zero delay with overflowing exponent is 0", func() policy.Retry { c := exp; c.Delay = 0; return c }(), 1 << 20, 0.5, 0},
		{"jitter above 1 clamps at 0", func() policy.Retry { c := withJitter; c.Jitter = 1.5; return c }(), 1, 0, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := New(tc.cfg).Delay(tc.attempt, fixedRand(tc.rnd)); got != tc.want {
				t.Fatalf("Delay(%d) = %v, want %v", tc.attempt, got, tc.want)
			}
		})
	}
}

// TestJitterBounds draws many delays from the policy's own source and checks
// they stay within d±d*jitter, reach both ends, and never pass max_delay.
func TestJitterBounds(t *testing.T) {
	cases := []struct {
		name    string
		cfg     policy.Retry
		attempt int
		lo, hi  time.Duration
		capped  bool
	}{
		{"±20% of 1s", policy.Retry{Logic: policy.RetryFixed, Delay: time.Second, MaxDelay: time.Minute, Jitter: 0.2}, 1, 800 * ms, 1200 * ms, false},
		{"±50% of 8s capped at 10s", policy.Retry{Logic: policy.RetryExponential, Delay: time.Second, Scale: 2, MaxDelay: 10 * time.Second, Jitter: 0.5}, 4, 4 * time.Second, 10 * time.Second, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := New(tc.cfg, WithSeed(42))
			seenLo, seenHi, atCap := tc.hi, tc.lo, 0
			for range 20000 {
				d := p.Delay(tc.attempt, nil)
				if d < tc.lo || d > tc.hi {
					t.Fatalf("delay %v outside [%v, %v]", d, tc.lo, tc.hi)
				}
				seenLo, seenHi = min(seenLo, d), max(seenHi, d)
				if d == tc.cfg.MaxDelay {
					atCap++
				}
			}
			span := tc.hi - tc.lo
			if seenLo > tc.lo+span/50 || seenHi < tc.hi-span/50 {
				t.Fatalf("draws span only [%v, %v] of [%v, %v]", seenLo, seenHi, tc.lo, tc.hi)
			}
			if tc.capped != (atCap > 0) {
				t.Fatalf("%d draws at the cap, capped=%v", atCap, tc.capped)
			}
		})
	}
}

func TestSeededJitterIsReproducible(t *testing.T) {
	cfg := policy.Retry{Logic: policy.RetryFixed, Delay: time.Second, MaxDelay: time.Minute, Jitter: 0.2}
	a, b := New(cfg, WithSeed(7)), New(cfg, WithSeed(7))
	for i := range 100 {
		if da, db := a.Delay(1, nil), b.Delay(1, nil); da != db {
			t.Fatalf("draw %d: %v != %v", i, da, db)
		}
	}
	calls := 0
	c := New(cfg, WithRand(func() float64 { calls++; return 1 - 1e-9 }))
	if d := c.Delay(1, nil); d <= 1199*ms || d > 1200*ms || calls != 1 {
		t.Fatalf("WithRand: delay %v after %d calls", d, calls)
	}
}

func TestDelayAsked(t *testing.T) {
	fixed := policy.Retry{Logic: policy.RetryFixed, Delay: 10 * time.Second, MaxDelay: time.Minute}
	uncapped := policy.Retry{Logic: policy.RetryFixed, Delay: 10 * time.Second}
	tests := []struct {
		name  string
		cfg   policy.Retry
		asked time.Duration
		want  time.Duration
	}{
		{"nothing asked", fixed, 0, 10 * time.Second},
		{"shorter than the delay", fixed, time.Second, 10 * time.Second},
		{"longer", fixed, 30 * time.Second, 30 * time.Second},
		{"past max_delay", fixed, time.Hour, time.Minute},
		{"no max_delay", uncapped, time.Hour, time.Hour},
	}
	for _, tt := range tests {
		if got := New(tt.cfg).DelayAsked(1, tt.asked); got != tt.want {
			t.Errorf("%s: DelayAsked(1, %v) = %v, want %v", tt.name, tt.asked, got, tt.want)
		}
	}
}

func TestNonRetryable(t *testing.T) {
	p := New(policy.Retry{Count: 3, NonRetryable: []string{"card_declined", "INVALID_ARGUMENT", ""}})
	for _, tc := range []struct {
		reason string
		want   bool
	}{
		{"Stripe error: card_declined (do_not_honor)", true},
		{"HTTP/1.1 402 Payment Required\n{\"error\":{\"code\":\"card_declined\"}}", true},
		{"rpc error: code = InvalidArgument desc = INVALID_ARGUMENT: bad id", true},
		{"HTTP/1.1 503 Service Unavailable", false},
		{"card declined", false},
		{"", false},
	} {
		if got := p.NonRetryable(tc.reason); got != tc.want {
			t.Errorf("NonRetryable(%q) = %v, want %v", tc.reason, got, tc.want)
		}
	}
}

func TestShouldRetry(t *testing.T) {
	p := New(policy.Retry{Count: 2, Budget: 1, NonRetryable: []string{"card_declined"}})
	for _, tc := range []struct {
		attempt int
		reason  string
		ok      bool
		control control.Name
	}{
		{1, "HTTP/1.1 503 Service Unavailable", true, ""},
		{2, "HTTP/1.1 503 Service Unavailable", true, ""},
		{3, "HTTP/1.1 503 Service Unavailable", false, ""},
		{0, "HTTP/1.1 503 Service Unavailable", false, ""},
		{1, "Stripe error: card_declined (do_not_honor)", false, ""},
	} {
		ok, refused := p.ShouldRetry(tc.attempt, tc.reason)
		if ok != tc.ok || refused != tc.control {
			t.Errorf("ShouldRetry(%d, %q) = %v, %q; want %v, %q", tc.attempt, tc.reason, ok, refused, tc.ok, tc.control)
		}
	}
	if p.Budget() != nil {
		t.Fatal("budget 1 must disable the budget")
	}
}

// TestShouldRetryBudget: once the budget is spent the decision names it,
// and count / non_retryable refusals do not consume it.
func TestShouldRetryBudget(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	p := New(policy.Retry{Count: 3, Budget: 0.1, NonRetryable: []string{"card_declined"}}, WithClock(clk))
	for range 20 {
		p.RecordExecution()
	}
	// 0/20 < 0.1 → allowed (now 1/21); 1/21 < 0.1; 2/22 < 0.1; 3/23 ≥ 0.1.
	for i := range 3 {
		if ok, c := p.ShouldRetry(1, "503"); !ok || c != "" {
			t.Fatalf("retry %d: %v %q", i, ok, c)
		}
	}
	p.ShouldRetry(4, "503")
	p.ShouldRetry(1, "card_declined")
	if e, r := p.Budget().Stats(); e != 23 || r != 3 {
		t.Fatalf("stats = %d executions, %d retries; want 23, 3", e, r)
	}
	if ok, c := p.ShouldRetry(1, "503"); ok || c != control.RetryBudget {
		t.Fatalf("spent budget: %v %q", ok, c)
	}
}

func TestBudget(t *testing.T) {
	type step struct {
		execs   int           // RecordExecution calls
		advance time.Duration // then move the clock
		tries   int           // then TryRetry calls
		allowed int           // how many of them must succeed
	}
	cases := []struct {
		name  string
		ratio float64
		steps []step
	}{
		{"under 20 executions never trips", 0.1, []step{
			{execs: 5, tries: 14, allowed: 14}, // 19 executions, 14 of them retries
		}},
		{"trips at the ratio once past 20", 0.2, []step{
			// 20 firsts: allowed while r/(20+r) < 0.2 → r = 0..4, then 5/25 stops it.
			{execs: 20, tries: 10, allowed: 5},
		}},
		{"exactly at the ratio is spent", 0.3, []step{
			{execs: 14, tries: 6, allowed: 6}, // 6/20 = 0.3, not < 0.3
			{tries: 1, allowed: 0},
		}},
		{"more traffic earns more retries", 0.2, []step{
			{execs: 20, tries: 10, allowed: 5},
			{execs: 20, tries: 10, allowed: 5},
		}},
		{"recovers after the window passes", 0.1, []step{
			{execs: 30, tries: 10, allowed: 4},
			{advance: 150 * time.Second, tries: 1, allowed: 0},
			{advance: 150 * time.Second, tries: 19, allowed: 19}, // all forgotten: back under 20
		}},
		{"window slides by buckets", 0.2, []step{
			{execs: 40, advance: 200 * time.Second},            // 40 firsts at t=0
			{execs: 10, tries: 10, allowed: 10},                // t=200: 10/60 < 0.2
			{advance: 110 * time.Second, tries: 1, allowed: 0}, // t=310: t=0 left the window, 10/20 ≥ 0.2
			{advance: 200 * time.Second, tries: 1, allowed: 1}, // t=510: everything left, under 20 again
		}},
		{"budget 1 never trips", 1, []step{{execs: 20, tries: 1000, allowed: 1000}}},
		{"budget 0 allows retries only under 20 executions", 0, []step{
			{execs: 15, tries: 10, allowed: 5},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewFake(time.Unix(1_700_000_000, 0))
			p := New(policy.Retry{Count: 1, Budget: tc.ratio}, WithClock(clk))
			for i, s := range tc.steps {
				for range s.execs {
					p.RecordExecution()
				}
				clk.Advance(s.advance)
				n := 0
				for range s.tries {
					if ok, _ := p.ShouldRetry(1, "503"); ok {
						n++
					}
				}
				if n != s.allowed {
					t.Fatalf("step %d: %d of %d retries allowed, want %d", i, n, s.tries, s.allowed)
				}
			}
		})
	}
}

// TestBudgetConcurrentTryRetry: the check-and-record is atomic, so however
// many goroutines race, no more retries pass than the ratio allows.
func TestBudgetConcurrentTryRetry(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	b := NewBudget(0.5, clk)
	for range 100 {
		b.RecordExecution()
	}
	var passed atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range 100 {
				if b.TryRetry() {
					passed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	// r/(100+r) < 0.5 → r ≤ 99.
	if n := passed.Load(); n != 100 {
		t.Fatalf("%d retries passed, want 100", n)
	}
}

func TestBudgetDoesNotAllocate(t *testing.T) {
	b := NewBudget(0.2, clock.NewFake(time.Unix(1_700_000_000, 0)))
	if n := testing.AllocsPerRun(1000, func() {
		b.RecordExecution()
		b.TryRetry()
	}); n != 0 {
		t.Fatalf("%v allocs per execution+retry", n)
	}
}
