package loadgen

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestBuckets(t *testing.T) {
	prev := -1
	for v := int64(0); v < 1<<22; v += 1 + v/1000 {
		i := bucketOf(v)
		if i < prev {
			t.Fatalf("bucket of %d = %d, below the previous %d", v, i, prev)
		}
		prev = i
		if lo, hi := lowerBound(i), lowerBound(i+1); v < lo || v >= hi {
			t.Fatalf("%d in bucket %d = [%d,%d)", v, i, lo, hi)
		}
	}
}

func TestQuantilesWithinOnePercent(t *testing.T) {
	var h Histogram
	vals := make([]int64, 100000)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range vals {
		vals[i] = int64(r.ExpFloat64() * 200_000) // ~200 µs mean
		h.Record(time.Duration(vals[i]))
	}
	slices.Sort(vals)
	for _, q := range []float64{0.5, 0.9, 0.99, 0.999} {
		want := float64(vals[int(q*float64(len(vals)))-1])
		got := float64(h.Quantile(q))
		if d := (got - want) / want; d > 0.01 || d < -0.01 {
			t.Errorf("p%v = %v, exact %v (%.2f%% off)", q*100, got, want, d*100)
		}
	}
	var m Histogram
	m.Merge(&h)
	if m.Count() != h.Count() || m.Quantile(0.99) != h.Quantile(0.99) || m.Max() != h.Max() {
		t.Error("merge changed the distribution")
	}
}
