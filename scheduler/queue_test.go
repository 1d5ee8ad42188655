package scheduler

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestQueueAgainstModel drives the index with random pushes, admissions,
// timeouts and completions and checks every head against a brute-force
// scan: the best waiting run (priority, then age) among keys with room.
func TestQueueAgainstModel(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	q := newQueue()
	d := q.def("sync")
	q.setKeyLimit(d, 2)
	q.enableFIFO(d)
	type run struct {
		key  string
		prio int32
		h    handle
	}
	waiting := map[uint64]run{}
	running := map[string]int{}
	var seq uint64
	for step := range 4000 {
		switch op := rnd.IntN(10); {
		case op < 5: // submit
			seq++
			k := fmt.Sprint("k", rnd.IntN(5))
			p := int32(rnd.IntN(3))
			waiting[seq] = run{key: k, prio: p, h: q.push(d, k, seq, p, int64(seq))}
		case op < 7: // admit the head
			if _, ok := q.head(d); !ok {
				break
			}
			e := q.admit(d)
			r := waiting[e.seq]
			delete(waiting, e.seq)
			running[r.key]++
		case op < 8: // a waiting run times out
			for s, r := range waiting {
				if e := q.remove(r.h); e.seq != s {
					t.Fatalf("step %d: took seq %d through handle of %d", step, e.seq, s)
				}
				delete(waiting, s)
				break
			}
		default: // a running run finishes
			for k, n := range running {
				if n > 0 {
					running[k]--
					q.finished(d, k)
					break
				}
			}
		}
		// Brute force.
		var best uint64
		for s, r := range waiting {
			if running[r.key] >= 2 {
				continue
			}
			if b, ok := waiting[best]; best == 0 || !ok || r.prio > b.prio || r.prio == b.prio && s < best {
				best = s
			}
		}
		it, ok := q.head(d)
		switch {
		case best == 0 && ok:
			t.Fatalf("step %d: head %d but no run may admit", step, it.seq)
		case best != 0 && (!ok || it.seq != best):
			t.Fatalf("step %d: head ok=%v seq %d, want %d", step, ok, it.seq, best)
		}
		if d.waiting != len(waiting) || q.n != len(waiting) {
			t.Fatalf("step %d: waiting %d/%d, want %d", step, d.waiting, q.n, len(waiting))
		}
		// The FIFO's oldest is the smallest seq still waiting (queuedAt = seq).
		var oldest uint64
		for s := range waiting {
			if oldest == 0 || s < oldest {
				oldest = s
			}
		}
		if h, ok := q.oldest(d); ok != (oldest != 0) || ok && q.slab[h].seq != oldest {
			t.Fatalf("step %d: oldest %v %d, want %d", step, ok, q.slab[h].seq, oldest)
		}
	}
}

func BenchmarkQueuePushTake(b *testing.B) {
	q := newQueue()
	d := q.def("sync")
	for i := range 1 << 16 {
		q.push(d, "", uint64(i), 0, int64(i))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		q.admit(d)
		q.finished(d, "")
		q.push(d, "", uint64(1<<16+i), 0, int64(i))
	}
}
