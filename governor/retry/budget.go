package retry

import (
	"sync"
	"time"

	"github.com/warden-dev/warden/governor/clock"
)

// Budget window (SPEC §4): long enough to see a retry storm building, short
// enough that a recovered target is not punished for a burst long ago.
const (
	BudgetWindow = 300 * time.Second
	// MinExecutions is the sample below which the budget never trips: with
	// less traffic the first retry alone would exceed any ratio.
	MinExecutions = 20

	budgetBuckets = 30
	budgetWidth   = int64(BudgetWindow / budgetBuckets)
)

// Budget caps retries at a ratio of executions over a rolling 300 s window.
//
// Executions are all attempts sent, first tries and retries alike, so the
// ratio retries/executions is at most 1 and budget 1 is naturally "no
// limit". A retry is allowed while, counting everything before it (not the
// retry being considered), executions < MinExecutions or
// retries/executions < ratio. An allowed retry is then counted as one retry
// and one execution.
//
// The window is 30 buckets of 10 s with running totals, so each call is
// O(1) amortised and allocation-free; a mutex guards it because the
// check-and-record must be atomic and the critical section is a few
// additions.
type Budget struct {
	ratio     float64
	clk       clock.Clock
	origin    time.Time
	realClock bool

	mu      sync.Mutex
	head    int64 // newest bucket epoch folded into the totals
	execs   int64 // totals over the buckets in (head-budgetBuckets, head]
	retries int64
	buckets [budgetBuckets]struct{ execs, retries int64 }
}

// NewBudget returns a budget allowing retries up to ratio of executions.
// clk nil means the real clock.
func NewBudget(ratio float64, clk clock.Clock) *Budget {
	if clk == nil {
		clk = clock.Real{}
	}
	b := &Budget{ratio: ratio, clk: clk, origin: clk.Now()}
	switch clk.(type) {
	case clock.Real, *clock.Real:
		// time.Since on the monotonic origin is one clock read instead of
		// time.Now's two, and ignores wall-clock steps.
		b.realClock = true
	}
	return b
}

func (b *Budget) epoch() int64 {
	var d time.Duration
	if b.realClock {
		d = time.Since(b.origin)
	} else {
		d = b.clk.Now().Sub(b.origin)
	}
	return max(int64(d), 0) / budgetWidth
}

// advanceLocked drops the buckets that left the window by epoch e. An e
// older than head (a clock read that lost the race for the lock) is counted
// in the head bucket: it is at most one bucket off.
func (b *Budget) advanceLocked(e int64) *struct{ execs, retries int64 } {
	if e > b.head {
		if e-b.head >= budgetBuckets {
			b.buckets = [budgetBuckets]struct{ execs, retries int64 }{}
			b.execs, b.retries = 0, 0
		} else {
			for h := b.head + 1; h <= e; h++ {
				bk := &b.buckets[h%budgetBuckets]
				b.execs -= bk.execs
				b.retries -= bk.retries
				*bk = struct{ execs, retries int64 }{}
			}
		}
		b.head = e
	}
	return &b.buckets[b.head%budgetBuckets]
}

// RecordExecution counts a first attempt.
func (b *Budget) RecordExecution() {
	e := b.epoch()
	b.mu.Lock()
	bk := b.advanceLocked(e)
	bk.execs++
	b.execs++
	b.mu.Unlock()
}

// TryRetry reports whether a retry fits the budget and, if so, counts it
// (as a retry and as an execution) in the same critical section, so
// concurrent callers cannot all squeeze through the last slot.
func (b *Budget) TryRetry() bool {
	e := b.epoch()
	b.mu.Lock()
	bk := b.advanceLocked(e)
	// Division rather than retries < ratio*execs: 0.3*20 rounds above 6,
	// which would let the 7th retry of 20 executions through.
	ok := b.execs < MinExecutions || float64(b.retries)/float64(b.execs) < b.ratio
	if ok {
		bk.execs++
		bk.retries++
		b.execs++
		b.retries++
	}
	b.mu.Unlock()
	return ok
}

// Stats returns the executions and retries currently in the window.
func (b *Budget) Stats() (executions, retries int64) {
	e := b.epoch()
	b.mu.Lock()
	b.advanceLocked(e)
	executions, retries = b.execs, b.retries
	b.mu.Unlock()
	return executions, retries
}
