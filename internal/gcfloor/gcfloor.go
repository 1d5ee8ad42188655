// Package gcfloor keeps the garbage collector's heap goal from falling below
// a floor, the way Go services with small heaps and high request rates are
// commonly tuned.
//
// A sidecar's live heap is a few megabytes. With the default GOGC=100 the
// collector runs each time the heap doubles from that, which at tens of
// thousands of requests a second is many cycles a second, each with its fixed
// costs (stacks scanned, write barriers on, assists). Measured on warden's RLS
// (make bench-rls), that is about a third of the server's CPU. Raising GOGC for
// good would also multiply a large heap (a million queued runs), so the floor
// adapts: after every cycle the percent is set so that the next goal is the
// larger of the floor and what GOGC=100 would give (about twice the live heap),
// i.e. GOGC=100 once the live heap is about half the floor or more.
// GOMEMLIMIT, when set, still caps the heap as usual.
package gcfloor

import (
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// Default is the floor `warden run` keeps: enough that a sidecar's
// per-request garbage does not trigger a cycle every few milliseconds, small
// beside the memory a pod is given.
const Default = 16 << 20

// runtimeHeapMinimum is the Go runtime's smallest heap goal at GOGC=100; it
// scales with the percent (4 MiB × GOGC/100), so a percent above
// floor/4 MiB × 100 would set a goal above the floor even for an empty heap.
const runtimeHeapMinimum = 4 << 20

// The pacer's goal is live + (live + stacks + globals) × GOGC/100 (Go 1.18
// and later count the roots), so all three are read.
var sampleNames = []string{"/gc/heap/live:bytes", "/gc/scan/stack:bytes", "/gc/scan/globals:bytes"}

// Floor adjusts GOGC after every collection while it runs.
type Floor struct {
	floor uint64
	prev  int // the percent in force when it started, restored by Stop

	mu      sync.Mutex // everything below
	stopped bool
	percent int
	sample  []metrics.Sample
	onTune  func(percent int) // tests: called after each adjustment
}

// Start keeps the heap goal at least floor bytes until Stop. GOGC is the
// process's setting: start at most one Floor at a time. When GOGC is set
// in the environment, that is the operator's choice: Start does nothing
// and returns nil, whose Stop does nothing either.
func Start(floor uint64) *Floor {
	if os.Getenv("GOGC") != "" {
		return nil
	}
	f := newFloor(floor)
	f.cycle()
	return f
}

func newFloor(floor uint64) *Floor {
	prev := debug.SetGCPercent(100)
	debug.SetGCPercent(prev)
	f := &Floor{floor: floor, prev: prev, percent: prev}
	for _, n := range sampleNames {
		f.sample = append(f.sample, metrics.Sample{Name: n})
	}
	return f
}

// Percent returns the GOGC percent the floor last set.
func (f *Floor) Percent() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.percent
}

// Stop stops adjusting and restores the percent in force before Start.
func (f *Floor) Stop() {
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return
	}
	f.stopped = true
	debug.SetGCPercent(f.prev)
	f.percent = f.prev
}

// sentinel is garbage whose cleanup marks the end of a collection.
type sentinel struct{ _ *byte } // a pointer keeps it out of the tiny allocator, whose blocks are freed late

// cycle sets the percent for the live heap the last collection found and
// arms the next call, from the cleanup of an object allocated now: it runs
// once the next collection has found the object unreachable.
func (f *Floor) cycle() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return
	}
	metrics.Read(f.sample)
	var v [3]uint64
	for i, s := range f.sample {
		if s.Value.Kind() == metrics.KindUint64 {
			v[i] = s.Value.Uint64()
		}
	}
	if p := percentFor(v[0], v[1]+v[2], f.floor); p != f.percent {
		debug.SetGCPercent(p)
		f.percent = p
	}
	if f.onTune != nil {
		f.onTune(f.percent)
	}
	runtime.AddCleanup(new(sentinel), func(f *Floor) { f.cycle() }, f)
}

// percentFor is the GOGC percent whose goal, for a live heap of live bytes
// and roots (stacks and globals) of roots bytes, is the larger of floor and
// the goal GOGC=100 gives.
func percentFor(live, roots, floor uint64) int {
	base := live + roots
	if live == 0 || live+base >= floor {
		return 100
	}
	p := (floor - live) * 100 / base
	return int(max(min(p, floor*100/runtimeHeapMinimum), 100))
}
