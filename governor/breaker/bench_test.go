package breaker

import (
	"testing"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/policy"
)

// benchCfg is the SPEC §4 default breaker; both implementations below are
// configured to the same semantics (rolling 30 s window in 20 buckets, trip
// at ≥10 requests and ≥50% failures, open 5 s) so the comparison is fair.
var benchCfg = policy.CircuitBreaker{
	Enabled: true, FailureRatio: 0.5, MinimumRequests: 10,
	Window: 30 * time.Second, Open: 5 * time.Second, MaxOpen: 60 * time.Second,
}

func BenchmarkBreakerAllowDone(b *testing.B) {
	br := New("bench", benchCfg, clock.Real{})
	b.ReportAllocs()
	for b.Loop() {
		t, _, ok := br.Allow()
		if !ok {
			b.Fatal("refused")
		}
		t.Done(Success)
	}
}

func BenchmarkBreakerAllowDoneParallel(b *testing.B) {
	br := New("bench", benchCfg, clock.Real{})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			t, _, ok := br.Allow()
			if !ok {
				panic("refused")
			}
			t.Done(Success)
		}
	})
}

// BenchmarkBreakerAllowOpen is the fail-fast path a dead target sees.
func BenchmarkBreakerAllowOpen(b *testing.B) {
	br := New("bench", benchCfg, clock.Real{})
	for range 10 {
		t, _, _ := br.Allow()
		t.Done(Failure)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, ok := br.Allow(); ok {
			b.Fatal("admitted")
		}
	}
}

// BenchmarkBreakerDisabled shows a target without a breaker pays ~nothing.
func BenchmarkBreakerDisabled(b *testing.B) {
	br := New("bench", policy.CircuitBreaker{}, clock.Real{})
	b.ReportAllocs()
	for b.Loop() {
		t, _, _ := br.Allow()
		t.Done(Success)
	}
}

func newGobreaker() *gobreaker.CircuitBreaker[struct{}] {
	return gobreaker.NewCircuitBreaker[struct{}](gobreaker.Settings{
		Name:         "bench",
		Interval:     benchCfg.Window,
		BucketPeriod: benchCfg.Window / numBuckets,
		Timeout:      benchCfg.Open,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			return c.Requests >= 10 && float64(c.TotalFailures)/float64(c.Requests) >= 0.5
		},
	})
}

func trivial() (struct{}, error) { return struct{}{}, nil }

func BenchmarkGobreakerExecute(b *testing.B) {
	cb := newGobreaker()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := cb.Execute(trivial); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkGobreakerExecuteParallel(b *testing.B) {
	cb := newGobreaker()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := cb.Execute(trivial); err != nil {
				panic(err)
			}
		}
	})
}
