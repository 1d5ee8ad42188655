// Package percpu spreads a hot counter over one stripe per processor, so
// that cores counting the same thing write different cache lines. A line
// written by two cores moves between them on every write, and that
// transfer, not the add itself, is what a shared counter costs under
// parallel load.
//
// The stripe is chosen by the id of the scheduler's P (the logical
// processor the goroutine runs on) at the moment of the call. The id is a
// hint: the goroutine may move right after, so stripes must still be
// updated atomically; the point is only that two cores rarely pick the
// same one.
package percpu

import (
	"runtime"
	_ "unsafe" // for go:linkname
)

// The runtime does not export the P id. procPin/procUnpin are what sync.Pool
// uses to find its per-P cache; the runtime keeps them linkable for outside
// packages (go.dev/issue/67401), and they cost a few nanoseconds.

//go:linkname procPin runtime.procPin
func procPin() int

//go:linkname procUnpin runtime.procUnpin
func procUnpin()

// MaxStripes bounds the stripes of one counter: past 64 cores the memory of
// a stripe each outweighs what the last few save.
const MaxStripes = 64

// Stripes returns how many stripes a counter created now should have:
// GOMAXPROCS rounded up to a power of two, at most MaxStripes. GOMAXPROCS
// may change later (the runtime follows container CPU limits); Index masks
// the id, so more processors than stripes only share stripes.
func Stripes() int {
	n := 1
	for n < runtime.GOMAXPROCS(0) && n < MaxStripes {
		n <<= 1
	}
	return n
}

// Index returns the stripe, out of stripes (a power of two), for the
// calling goroutine's current processor. With one stripe (GOMAXPROCS was 1)
// it costs nothing.
func Index(stripes int) int {
	if stripes == 1 {
		return 0
	}
	return index(stripes)
}

func index(stripes int) int {
	id := procPin()
	procUnpin()
	return id & (stripes - 1)
}

// Pin returns the calling goroutine's processor id and keeps the goroutine
// on that processor, unpreempted, until Unpin: code between the two is the
// only code running on that processor, so per-processor state it owns can
// be changed without a lock. It must not block, allocate or run long.
func Pin() int { return procPin() }

// Unpin ends Pin.
func Unpin() { procUnpin() }
