package percpu

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

func TestStripes(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, tc := range []struct{ procs, want int }{
		{1, 1}, {2, 2}, {3, 4}, {8, 8}, {9, 16}, {64, 64}, {100, MaxStripes},
	} {
		runtime.GOMAXPROCS(tc.procs)
		if got := Stripes(); got != tc.want {
			t.Errorf("GOMAXPROCS=%d: Stripes() = %d, want %d", tc.procs, got, tc.want)
		}
	}
}

// Index must stay in range whatever the processor ids are, including when
// GOMAXPROCS grew past the stripes a counter was built with.
func TestIndexInRange(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(8))
	for _, stripes := range []int{1, 2, 4} {
		var wg sync.WaitGroup
		for range 32 {
			wg.Go(func() {
				for range 1000 {
					if i := Index(stripes); i < 0 || i >= stripes {
						t.Errorf("Index(%d) = %d", stripes, i)
						return
					}
				}
			})
		}
		wg.Wait()
	}
}

// Goroutines running at the same time on different processors must be
// told different stripes: that is the whole point. Each goroutine keeps its
// processor busy (it spins, never parks) until both have their stripe, so
// the second cannot be scheduled onto the first one's processor — unless
// the machine is so loaded that the runtime preempts the spinner (after
// 10 ms) before the other processor's thread runs, hence a few attempts. An
// Index that ignored the processor would fail every one.
func TestIndexDiffersAcrossProcessors(t *testing.T) {
	const procs, attempts = 2, 20
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
	for range attempts {
		var (
			got     [procs]int
			arrived atomic.Int32
			wg      sync.WaitGroup
		)
		for g := range procs {
			wg.Go(func() {
				got[g] = Index(procs)
				arrived.Add(1)
				for arrived.Load() < procs {
				}
			})
		}
		wg.Wait()
		if got[0] != got[1] {
			return
		}
	}
	t.Fatalf("in %d attempts, two goroutines running together always got the same stripe", attempts)
}

func BenchmarkIndex(b *testing.B) {
	s := Stripes()
	for b.Loop() {
		Index(s)
	}
}
