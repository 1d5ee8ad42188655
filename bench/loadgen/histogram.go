package loadgen

import (
	"math"
	"math/bits"
	"time"
)

// subBits sets the histogram's precision: each power of two is split into
// 2^subBits linear buckets, so a recorded value is off by less than
// 1/2^subBits (0.8%) — an HDR-style log-linear layout.
const subBits = 7

const subCount = 1 << subBits

// Histogram records latencies from 1 ns to about 2^40 ns (18 min) with
// bounded relative error and O(1) recording. It is not safe for concurrent
// use: each worker keeps its own and they are merged.
type Histogram struct {
	counts [41 * subCount]uint64
	total  uint64
	max    int64
}

func bucketOf(v int64) int {
	if v < subCount {
		return int(v)
	}
	exp := bits.Len64(uint64(v)) - subBits // ≥ 1
	sub := int(v>>uint(exp-1)) - subCount  // top subBits after the leading 1
	return exp*subCount + sub
}

// lowerBound is the smallest value of bucket i.
func lowerBound(i int) int64 {
	exp, sub := i/subCount, i%subCount
	if exp == 0 {
		return int64(sub)
	}
	return int64(subCount+sub) << uint(exp-1)
}

// Record adds one latency.
func (h *Histogram) Record(d time.Duration) {
	v := max(int64(d), 0)
	i := bucketOf(v)
	if i >= len(h.counts) {
		i = len(h.counts) - 1
	}
	h.counts[i]++
	h.total++
	h.max = max(h.max, v)
}

// Merge adds o's counts to h.
func (h *Histogram) Merge(o *Histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.total += o.total
	h.max = max(h.max, o.max)
}

// Count is the number of recorded values.
func (h *Histogram) Count() uint64 { return h.total }

// Max is the largest recorded value.
func (h *Histogram) Max() time.Duration { return time.Duration(h.max) }

// Quantile returns the value at quantile q (0..1): the midpoint of the
// bucket holding it, capped at the maximum seen.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.total == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.total)))
	rank = max(rank, 1)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			lo, hi := lowerBound(i), lowerBound(i+1)
			return time.Duration(min((lo+hi-1)/2, h.max))
		}
	}
	return time.Duration(h.max)
}
