package retry

import (
	"testing"
	"time"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/policy"
)

var benchRetry = policy.Retry{
	Count: 3, Logic: policy.RetryExponential, Delay: 100 * time.Millisecond, Scale: 2,
	MaxDelay: 5 * time.Second, Jitter: 0.2, Budget: 0.3, NonRetryable: []string{"card_declined"},
}

// BenchmarkBudget is one first attempt plus one retry decision, the budget
// work a failing request costs.
func BenchmarkBudget(b *testing.B) {
	bu := NewBudget(0.3, clock.Real{})
	b.ReportAllocs()
	for b.Loop() {
		bu.RecordExecution()
		bu.TryRetry()
	}
}

func BenchmarkBudgetParallel(b *testing.B) {
	bu := NewBudget(0.3, clock.Real{})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			bu.RecordExecution()
			bu.TryRetry()
		}
	})
}

func BenchmarkShouldRetry(b *testing.B) {
	p := New(benchRetry)
	reason := "HTTP/1.1 503 Service Unavailable"
	b.ReportAllocs()
	for b.Loop() {
		p.RecordExecution()
		p.ShouldRetry(1, reason)
	}
}

func BenchmarkDelay(b *testing.B) {
	p := New(benchRetry)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		_ = p.Delay(i%5+1, nil)
	}
}
