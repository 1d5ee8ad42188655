package window

import (
	"math/bits"
	"time"
)

// TakeAll implements Counter. It holds the locks of every shard involved,
// taken in ascending order so two TakeAlls cannot deadlock, checks every
// window and then commits them all or none: exact, like the Redis script.
func (m *Memory) TakeAll(ws []Want, now time.Time, out []Decision) bool {
	var mask uint64 // shardCount is 64: one bit per shard
	for _, w := range ws {
		mask |= 1 << (keyHash(w.Scope, w.Key) & (shardCount - 1))
	}
	for b := mask; b != 0; b &= b - 1 {
		m.shards[bits.TrailingZeros64(b)].mu.Lock()
	}
	all := true
	for i, w := range ws {
		cur := m.spans.current(w.Scope.Window, now)
		sh, h := m.lookup(w.Scope, w.Key)
		d := Decision{Limit: w.Limit, start: cur.start, end: cur.end, loc: now.Location()}
		if e := &sh.slots[sh.find(h)]; e.h != 0 {
			switch end := e.end(); {
			case end == cur.endSec:
				d.Count = e.count()
			case end > cur.endSec: // a newer window exists; count there, as Take does
				d.Count, d.end = e.count(), end*int64(time.Second)
			}
		}
		d.Allowed = d.Count+w.N <= w.Limit
		all = all && d.Allowed
		out[i] = d
	}
	if all {
		for i, w := range ws {
			sh, h := m.lookup(w.Scope, w.Key)
			j := sh.find(h)
			if sh.slots[j].h == 0 {
				j = sh.insert(j, h, w.Scope, w.Key)
			}
			out[i].Count += w.N
			sh.slots[j].set(out[i].end/int64(time.Second), out[i].Count)
		}
	}
	for b := mask; b != 0; b &= b - 1 {
		m.shards[bits.TrailingZeros64(b)].mu.Unlock()
	}
	return all
}
