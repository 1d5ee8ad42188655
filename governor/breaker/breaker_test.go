package breaker

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/policy"
)

// defaults is the SPEC §4 default breaker with a window of 30 s.
var defaults = policy.CircuitBreaker{
	Enabled: true, FailureRatio: 0.5, MinimumRequests: 10,
	Window: 30 * time.Second, Open: 5 * time.Second, MaxOpen: 60 * time.Second,
}

func with(f func(*policy.CircuitBreaker)) policy.CircuitBreaker {
	c := defaults
	f(&c)
	return c
}

// clockEnv is a way of running a breaker against a controllable clock.
// "fake" uses clock.Fake, where the breaker reads the clock on every event.
// "real" uses clock.Real inside a synctest bubble, which exercises the
// timer-driven bucket cache the production clock gets; there time.Sleep
// moves the bubble's virtual clock instantly and synctest.Wait lets the
// bucket timer's callback finish, so nothing waits on wall time.
type clockEnv struct {
	name string
	run  func(t *testing.T, f func(t *testing.T, clk clock.Clock, advance func(time.Duration)))
}

var clockEnvs = []clockEnv{
	{"fake", func(t *testing.T, f func(*testing.T, clock.Clock, func(time.Duration))) {
		clk := clock.NewFake(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
		f(t, clk, clk.Advance)
	}},
	{"real", func(t *testing.T, f func(*testing.T, clock.Clock, func(time.Duration))) {
		synctest.Test(t, func(t *testing.T) {
			f(t, clock.Real{}, func(d time.Duration) {
				time.Sleep(d)
				synctest.Wait()
			})
		})
	}},
}

// harness drives one breaker through a scripted scenario.
type harness struct {
	t       *testing.T
	b       *Breaker
	advance func(time.Duration)
}

type step func(h *harness)

// do admits n requests and completes each with o.
func do(o Outcome, n int) step {
	return func(h *harness) {
		h.t.Helper()
		for i := range n {
			tk, _, ok := h.b.Allow()
			if !ok {
				h.t.Fatalf("request %d refused, state %v", i, h.b.State())
			}
			tk.Done(o)
		}
	}
}

func httpStatus(status, n int) step { return do(ClassifyHTTP(status), n) }
func grpcCode(code, n int) step     { return do(ClassifyGRPC(code), n) }

func wait(d time.Duration) step { return func(h *harness) { h.advance(d) } }

func want(s State) step {
	return func(h *harness) {
		h.t.Helper()
		if got := h.b.State(); got != s {
			h.t.Fatalf("state = %v, want %v", got, s)
		}
		if got := h.b.Snapshot().State; got != s.String() {
			h.t.Fatalf("snapshot state = %q, want %q", got, s)
		}
	}
}

// refused asserts the next request fails fast with exactly retryAfter.
func refused(retryAfter time.Duration) step {
	return func(h *harness) {
		h.t.Helper()
		tk, ra, ok := h.b.Allow()
		if ok {
			tk.Done(Neutral)
			h.t.Fatalf("admitted, want refused with retryAfter %v", retryAfter)
		}
		if ra != retryAfter {
			h.t.Fatalf("retryAfter = %v, want %v", ra, retryAfter)
		}
	}
}

func counts(requests, failures int64) step {
	return func(h *harness) {
		h.t.Helper()
		s := h.b.Snapshot()
		if s.Requests != requests || s.Failures != failures {
			h.t.Fatalf("window = %d requests / %d failures, want %d / %d", s.Requests, s.Failures, requests, failures)
		}
	}
}

// probe admits the half-open probe, checks that nobody else gets in while it
// is out, and completes it with o.
func probe(o Outcome) step {
	return func(h *harness) {
		h.t.Helper()
		tk, _, ok := h.b.Allow()
		if !ok {
			h.t.Fatalf("probe refused, state %v", h.b.State())
		}
		if _, ra, ok := h.b.Allow(); ok || ra != halfOpenRetryAfter {
			h.t.Fatalf("second request during probe: ok=%v retryAfter=%v", ok, ra)
		}
		tk.Done(o)
	}
}

func trip(h *harness) {
	h.t.Helper()
	do(Failure, 10)(h)
	want(Open)(h)
}

func TestBreakerScenarios(t *testing.T) {
	cases := []struct {
		name  string
		cfg   policy.CircuitBreaker
		steps []step
	}{
		{"closed below minimum at 100% failures", defaults, []step{
			do(Failure, 9), want(Closed), counts(9, 9),
		}},
		{"opens at the ratio", defaults, []step{
			do(Success, 5), do(Failure, 4), want(Closed), do(Failure, 1), want(Open), counts(10, 5),
		}},
		{"stays closed just under the ratio", defaults, []step{
			do(Success, 6), do(Failure, 4), want(Closed), do(Success, 100), want(Closed),
		}},
		{"ratio 0.3 trips at exactly 3 of 10", with(func(c *policy.CircuitBreaker) { c.FailureRatio = 0.3 }), []step{
			do(Success, 7), do(Failure, 2), want(Closed), do(Failure, 1), want(Open),
		}},
		{"a success reaching minimum_requests can trip", defaults, []step{
			do(Failure, 9), want(Closed), do(Success, 1), want(Open),
		}},
		{"404 storm never opens", defaults, []step{
			httpStatus(404, 1000), httpStatus(422, 100), want(Closed), counts(1100, 0),
		}},
		{"429s open it", defaults, []step{httpStatus(429, 10), want(Open)}},
		{"503s open it", defaults, []step{httpStatus(200, 5), httpStatus(503, 5), want(Open)}},
		{"gRPC UNAVAILABLE opens it", defaults, []step{grpcCode(14, 10), want(Open)}},
		{"gRPC NOT_FOUND and CANCELLED never open it", defaults, []step{
			grpcCode(5, 100), grpcCode(1, 100), want(Closed), counts(100, 0),
		}},
		{"open fails fast with the time left", defaults, []step{
			trip, refused(5 * time.Second), wait(2 * time.Second), refused(3 * time.Second),
			wait(2500 * time.Millisecond), refused(500 * time.Millisecond), want(Open),
		}},
		{"half-open after open, probe success closes and clears", defaults, []step{
			trip, wait(5 * time.Second), want(HalfOpen), probe(Success), want(Closed), counts(0, 0),
			do(Failure, 9), want(Closed),
		}},
		{"probe failure doubles open up to max_open, clean close resets it",
			with(func(c *policy.CircuitBreaker) { c.MaxOpen = 12 * time.Second }), []step{
				trip, wait(5 * time.Second), probe(Failure), want(Open), refused(10 * time.Second),
				wait(10 * time.Second), probe(Failure), refused(12 * time.Second),
				wait(12 * time.Second), probe(Failure), refused(12 * time.Second),
				wait(12 * time.Second), probe(Success), want(Closed),
				trip, refused(5 * time.Second),
			}},
		{"neutral probe frees the slot", defaults, []step{
			trip, wait(5 * time.Second), probe(Neutral), want(HalfOpen), probe(Neutral), probe(Success), want(Closed),
		}},
		{"rolling window forgets old failures", defaults, []step{
			do(Failure, 9), wait(31 * time.Second), counts(0, 0), do(Failure, 1), want(Closed), counts(1, 1),
		}},
		{"rolling window remembers recent failures", defaults, []step{
			do(Failure, 5), wait(25 * time.Second), do(Failure, 4), want(Closed), do(Failure, 1), want(Open),
		}},
		{"window slides bucket by bucket", defaults, []step{
			do(Failure, 4), wait(15 * time.Second), do(Success, 6), want(Closed), wait(16 * time.Second),
			counts(6, 0), do(Failure, 5), want(Closed), do(Failure, 1), want(Open),
		}},
		{"disabled never opens", policy.CircuitBreaker{}, []step{
			do(Failure, 1000), want(Closed), counts(0, 0),
		}},
		{"minimum 0 means any failure counts", with(func(c *policy.CircuitBreaker) { c.MinimumRequests = 0 }), []step{
			do(Success, 1), do(Failure, 1), want(Open),
		}},
	}
	for _, env := range clockEnvs {
		for _, tc := range cases {
			t.Run(env.name+"/"+tc.name, func(t *testing.T) {
				env.run(t, func(t *testing.T, clk clock.Clock, advance func(time.Duration)) {
					h := &harness{t: t, b: New("stripe", tc.cfg, clk), advance: advance}
					for _, s := range tc.steps {
						s(h)
					}
				})
			})
		}
	}
}

// TestHalfOpenAdmitsExactlyOne races 100 goroutines at a breaker whose open
// period has just expired; only one may become the probe.
func TestHalfOpenAdmitsExactlyOne(t *testing.T) {
	for _, env := range clockEnvs {
		t.Run(env.name, func(t *testing.T) {
			env.run(t, func(t *testing.T, clk clock.Clock, advance func(time.Duration)) {
				for round := range 20 {
					b := New("stripe", defaults, clk)
					h := &harness{t: t, b: b, advance: advance}
					trip(h)
					advance(5 * time.Second)
					// Let every contender reach the lock having seen the
					// same expired open state, the interleaving that would
					// admit several probes if the state were not re-checked.
					b.testHookPreProbe = runtime.Gosched

					var admitted atomic.Int32
					var probes sync.Map
					start := make(chan struct{})
					var wg sync.WaitGroup
					for i := range 100 {
						wg.Go(func() {
							<-start
							if tk, _, ok := b.Allow(); ok {
								admitted.Add(1)
								probes.Store(i, tk)
							}
						})
					}
					close(start)
					wg.Wait()
					if n := admitted.Load(); n != 1 {
						t.Fatalf("round %d: %d goroutines admitted in half-open, want 1", round, n)
					}
					probes.Range(func(_, v any) bool { v.(Ticket).Done(Success); return true })
					want(Closed)(h)
				}
			})
		})
	}
}

// TestConcurrentStress mixes outcomes from many goroutines while time moves,
// checking that at no moment two probes are out. Run with -race.
func TestConcurrentStress(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	b := New("stripe", with(func(c *policy.CircuitBreaker) { c.Open = time.Second; c.MaxOpen = 4 * time.Second }), clk)
	var probesOut atomic.Int32
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				tk, _, ok := b.Allow()
				if !ok {
					continue
				}
				isProbe := tk.word&phMask != phClosed
				if isProbe && probesOut.Add(1) != 1 {
					t.Error("two probes out at once")
				}
				o := Outcome((g + i) % 3)
				if isProbe {
					probesOut.Add(-1)
				}
				tk.Done(o)
			}
		})
	}
	for range 400 {
		clk.Advance(100 * time.Millisecond)
		_ = b.Snapshot()
	}
	close(stop)
	wg.Wait()
}

func TestStaleTicketsIgnored(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	b := New("stripe", defaults, clk)
	h := &harness{t: t, b: b, advance: clk.Advance}

	// Tickets issued while closed, completed after the breaker opened.
	var early []Ticket
	for range 20 {
		tk, _, _ := b.Allow()
		early = append(early, tk)
	}
	trip(h)
	counts(10, 10)(h)
	for _, tk := range early[:10] {
		tk.Done(Failure)
	}
	counts(10, 10)(h)

	// Close through a probe; the old tickets must not pollute the new window.
	wait(5 * time.Second)(h)
	probe(Success)(h)
	for _, tk := range early[10:] {
		tk.Done(Failure)
	}
	want(Closed)(h)
	counts(0, 0)(h)

	// A probe ticket is single-use: completing it twice must not reopen.
	trip(h)
	wait(5 * time.Second)(h)
	pt, _, ok := b.Allow()
	if !ok {
		t.Fatal("probe refused")
	}
	pt.Done(Success)
	pt.Done(Failure)
	want(Closed)(h)
}

// TestProbeLease: a probe out longer than its lease is presumed lost, so a
// ticket never completed cannot hold the breaker half-open forever, and its
// late result is then stale. Within the lease, however long (past max_open,
// as a probe under a long target timeout is), and with no lease at all,
// nobody else gets through.
func TestProbeLease(t *testing.T) {
	cases := []struct {
		name  string
		lease time.Duration
		out   time.Duration // how long the first probe stays out
		lost  bool
	}{
		{"past its lease", 11 * time.Second, 11 * time.Second, true},
		{"within a lease longer than max_open", 2 * time.Minute, 119 * time.Second, false},
		{"no lease", 0, time.Hour, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewFake(time.Unix(1_700_000_000, 0))
			b := New("stripe", defaults, clk)
			b.SetProbeLease(tc.lease)
			h := &harness{t: t, b: b, advance: clk.Advance}
			trip(h)
			wait(5 * time.Second)(h)
			first, _, ok := b.Allow()
			if !ok {
				t.Fatal("probe refused")
			}
			wait(tc.out - time.Second)(h)
			refused(halfOpenRetryAfter)(h)
			wait(time.Second)(h)
			if !tc.lost {
				refused(halfOpenRetryAfter)(h)
				first.Done(Success)
				want(Closed)(h)
				return
			}
			probe(Success)(h)
			first.Done(Failure)
			want(Closed)(h)
		})
	}
}

func TestOnStateChange(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	var got []string
	b := New("stripe", defaults, clk, Options{OnStateChange: func(name string, from, to State) {
		got = append(got, fmt.Sprintf("%s:%v>%v", name, from, to))
	}})
	h := &harness{t: t, b: b, advance: clk.Advance}
	trip(h)
	wait(5 * time.Second)(h)
	probe(Neutral)(h) // half_open → half_open is no change
	probe(Failure)(h)
	wait(10 * time.Second)(h)
	probe(Success)(h)
	b.Reset() // already closed: no change
	want := []string{
		"stripe:closed>open", "stripe:open>half_open", "stripe:half_open>open",
		"stripe:open>half_open", "stripe:half_open>closed",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("transitions\n got %v\nwant %v", got, want)
	}
}

func TestSnapshot(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	b := New("stripe", defaults, clk)
	h := &harness{t: t, b: b, advance: clk.Advance}
	do(Success, 6)(h)
	do(Failure, 4)(h)
	if s := b.Snapshot(); s != (Snapshot{Target: "stripe", State: "closed", Requests: 10, Failures: 4, FailureRatio: 0.4}) {
		t.Fatalf("closed snapshot = %+v", s)
	}
	do(Failure, 2)(h)
	wait(1500 * time.Millisecond)(h)
	if s := b.Snapshot(); s != (Snapshot{Target: "stripe", State: "open", Requests: 12, Failures: 6, FailureRatio: 0.5, OpenForSeconds: 3.5}) {
		t.Fatalf("open snapshot = %+v", s)
	}
	b.Reset()
	if s := b.Snapshot(); s != (Snapshot{Target: "stripe", State: "closed"}) {
		t.Fatalf("after reset = %+v", s)
	}
	var nilB *Breaker
	if _, _, ok := nilB.Allow(); !ok || nilB.State() != Closed || nilB.Snapshot().State != "closed" {
		t.Fatal("nil breaker must behave as disabled")
	}
}

func TestAllowDoneDoesNotAllocate(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	for _, cfg := range []policy.CircuitBreaker{defaults, {}} {
		b := New("stripe", cfg, clk)
		if n := testing.AllocsPerRun(1000, func() {
			tk, _, _ := b.Allow()
			tk.Done(Success)
		}); n != 0 {
			t.Fatalf("enabled=%v: %v allocs per Allow+Done", cfg.Enabled, n)
		}
	}
}

func TestClassifyHTTP(t *testing.T) {
	for _, tc := range []struct {
		status int
		want   Outcome
	}{
		{0, Failure}, {100, Success}, {200, Success}, {204, Success}, {301, Success}, {304, Success},
		{400, Success}, {401, Success}, {404, Success}, {422, Success}, {428, Success},
		{429, Failure}, {431, Success}, {499, Success},
		{500, Failure}, {502, Failure}, {503, Failure}, {504, Failure}, {599, Failure},
	} {
		if got := ClassifyHTTP(tc.status); got != tc.want {
			t.Errorf("ClassifyHTTP(%d) = %v, want %v", tc.status, got, tc.want)
		}
	}
}

func TestClassifyGRPC(t *testing.T) {
	want := map[int]Outcome{
		0: Success, 1: Neutral, 2: Failure, 3: Success, 4: Failure, 5: Success, 6: Success,
		7: Success, 8: Failure, 9: Success, 10: Success, 11: Success, 12: Success,
		13: Failure, 14: Failure, 15: Success, 16: Success,
	}
	for code, w := range want {
		if got := ClassifyGRPC(code); got != w {
			t.Errorf("ClassifyGRPC(%d) = %v, want %v", code, got, w)
		}
	}
}

func TestStateString(t *testing.T) {
	for s, w := range map[State]string{Closed: "closed", HalfOpen: "half_open", Open: "open", 7: "unknown"} {
		if s.String() != w {
			t.Errorf("%d.String() = %q, want %q", s, s.String(), w)
		}
	}
}

// Requests are counted per processor; the window must still see every one
// of them, and a failure must be judged against all of them: 8 goroutines
// on 4 processors record 2,000 successes each, the last processor's stripe
// 1,000 more, and then 16,999 failures must leave the breaker closed (just
// under 50%) while one more opens it.
func TestStripedRequestsAllCounted(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	b := New("stripe", defaults, clk)
	if len(b.reqs) != 4 {
		t.Fatalf("%d stripes at GOMAXPROCS=4, want 4", len(b.reqs))
	}
	const goroutines, each = 8, 2000
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for range each {
				tk, _, ok := b.Allow()
				if !ok {
					t.Error("closed breaker refused")
					return
				}
				tk.Done(Success)
				runtime.Gosched() // move between processors
			}
		})
	}
	wg.Wait()
	if s := b.Snapshot(); s.Requests != goroutines*each {
		t.Fatalf("window holds %d requests, want %d", s.Requests, goroutines*each)
	}
	// Whichever processors the goroutines happened to run on, the last
	// stripe now holds requests too, as if its processor had counted them:
	// the trip decision must read every stripe.
	const extra = 1000
	b.reqs[len(b.reqs)-1].requests[b.currentEpoch()%numBuckets].Add(extra)
	const total = goroutines*each + extra
	if s := b.Snapshot(); s.Requests != total {
		t.Fatalf("window holds %d requests, want %d", s.Requests, total)
	}
	for range total - 1 {
		tk, _, _ := b.Allow()
		tk.Done(Failure)
	}
	if st := b.State(); st != Closed {
		t.Fatalf("state %v after %d failures to %d successes, want closed", st, total-1, total)
	}
	tk, _, _ := b.Allow()
	tk.Done(Failure)
	if st := b.State(); st != Open {
		t.Fatalf("state %v at 50%% failures, want open", st)
	}
}

// TestRefusesTakesNoProbe: Refuses answers as Allow would, and asking
// leaves the half-open probe to the next Allow.
func TestRefusesTakesNoProbe(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	b := New("stripe", defaults, clk)
	h := &harness{t: t, b: b, advance: clk.Advance}
	check := func(step string, wantAfter time.Duration, wantRefused bool) {
		t.Helper()
		if after, refused := b.Refuses(); refused != wantRefused || after != wantAfter {
			t.Fatalf("%s: Refuses() = %v, %v; want %v, %v", step, after, refused, wantAfter, wantRefused)
		}
	}
	check("closed", 0, false)
	trip(h)
	check("open", 5*time.Second, true)
	clk.Advance(2 * time.Second)
	check("open, 2 s later", 3*time.Second, true)
	clk.Advance(3 * time.Second)
	for range 3 {
		check("open elapsed", 0, false)
	}
	probe, _, ok := b.Allow()
	if !ok || !probe.Probe() {
		t.Fatalf("Allow after Refuses: ok %v, probe %v; want the probe", ok, probe.Probe())
	}
	check("probe out", halfOpenRetryAfter, true)
	probe.Done(Success)
	check("closed again", 0, false)

	var none *Breaker
	if _, refused := none.Refuses(); refused {
		t.Error("a nil breaker refuses")
	}
	if _, refused := New("off", with(func(c *policy.CircuitBreaker) { c.Enabled = false }), clk).Refuses(); refused {
		t.Error("a disabled breaker refuses")
	}
}
