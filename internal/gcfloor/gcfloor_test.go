package gcfloor

import (
	"runtime"
	"runtime/debug"
	"testing"
	"time"
)

func TestPercentFor(t *testing.T) {
	const mib = 1 << 20
	tests := []struct {
		live, roots, floor uint64
		want               int
	}{
		{live: 4 * mib, floor: 32 * mib, want: 700},                  // goal 4 + 4 × 7 = 32 MiB
		{live: 4 * mib, roots: 3 * mib, floor: 32 * mib, want: 400},  // goal 4 + 7 × 4 = 32 MiB
		{live: 16 * mib, floor: 32 * mib, want: 100},                 // 2 × live reaches the floor
		{live: 14 * mib, roots: 4 * mib, floor: 32 * mib, want: 100}, // 14 + 18 reaches it
		{live: 100 * mib, floor: 32 * mib, want: 100},
		{live: 1024, floor: 32 * mib, want: 800}, // the runtime's 4 MiB minimum × 8 is the floor
		{live: 0, floor: 32 * mib, want: 100},    // nothing measured yet
	}
	for _, tt := range tests {
		if got := percentFor(tt.live, tt.roots, tt.floor); got != tt.want {
			t.Errorf("percentFor(%d, %d, %d) = %d, want %d", tt.live, tt.roots, tt.floor, got, tt.want)
		}
	}
}

// A floor far above the test's live heap raises GOGC after a collection,
// and Stop puts the previous setting back.
func TestFloorFollowsCollections(t *testing.T) {
	before := debug.SetGCPercent(100)
	defer debug.SetGCPercent(before)

	tuned := make(chan int, 16)
	f := newFloor(1 << 30)
	f.onTune = func(p int) {
		select {
		case tuned <- p:
		default:
		}
	}
	f.cycle()
	<-tuned // the first call, made by cycle itself
	runtime.GC()
	runtime.GC() // the sentinel is unreachable after the first; the second frees it for sure
	select {
	case p := <-tuned:
		if p <= 100 {
			t.Fatalf("after a collection the percent is %d, want > 100 for a 1 GiB floor", p)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no adjustment after two collections: the next cycle was not armed")
	}
	if got := debug.SetGCPercent(100); got != f.Percent() {
		t.Fatalf("GOGC is %d, the floor says it set %d", got, f.Percent())
	}
	debug.SetGCPercent(f.Percent())
	f.Stop()
	if got := debug.SetGCPercent(100); got != 100 {
		t.Fatalf("after Stop GOGC is %d, want the previous 100", got)
	}
}

// GOGC in the environment is the operator's: no floor, and a nil one stops
// harmlessly.
func TestStartLeavesGOGCAlone(t *testing.T) {
	t.Setenv("GOGC", "100")
	f := Start(1 << 30)
	if f != nil {
		t.Fatal("Start set a floor although GOGC is set")
	}
	f.Stop()
}
