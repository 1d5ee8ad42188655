package window

import (
	"math/bits"
	"time"
)

// TakeAll implements Counter. It holds the locks of every shard involved,
// taken in ascending order, so no rebuild moves a slot and no other TakeAll
// interleaves; it checks every window, then commits each with a checked
// swap. A lock-free Take can still fill a window between the check and the
// commit: then the takes already committed are given back and the whole
// call is refused, so no window ever goes past its limit (a concurrent Take
// may see the briefly raised count and be refused: the error is on the
// side of the limit).
func (m *Memory) TakeAll(ws []Want, now time.Time, out []Decision) bool {
	var mask uint64 // shardCount is 64: one bit per shard
	for _, w := range ws {
		mask |= 1 << (keyHash(w.Scope, w.Key) & (shardCount - 1))
	}
	for b := mask; b != 0; b &= b - 1 {
		m.shards[bits.TrailingZeros64(b)].mu.Lock()
	}
	defer func() {
		for b := mask; b != 0; b &= b - 1 {
			m.shards[bits.TrailingZeros64(b)].mu.Unlock()
		}
	}()
	all := true
	for i, w := range ws {
		out[i] = m.peekLocked(w, now)
		all = all && out[i].Allowed
	}
	if !all {
		return false
	}
	for i, w := range ws {
		sh, h := m.lookup(w.Scope, w.Key)
		e := sh.slotLocked(h, w.Scope, w.Key)
		count, ok, endSec, _ := take(e, out[i].end/int64(time.Second), w.Limit, w.N)
		if ok {
			out[i].Count = count
			continue
		}
		for j := range i {
			m.giveBackLocked(ws[j], out[j])
			out[j].Count -= ws[j].N
			out[j].Allowed = false
		}
		out[i].Count, out[i].Allowed = count, false
		if endSec > out[i].end/int64(time.Second) {
			out[i].end = endSec * int64(time.Second)
		}
		return false
	}
	return true
}

// peekLocked decides w without taking: the window's count and whether w.N
// more fit. The shard's lock must be held.
func (m *Memory) peekLocked(w Want, now time.Time) Decision {
	cur := m.spans.current(w.Scope.Window, now)
	sh, h := m.lookup(w.Scope, w.Key)
	d := Decision{Limit: w.Limit, start: cur.start, end: cur.end, loc: now.Location()}
	if e := sh.tab.Load().get(h); e != nil {
		v := e.w.Load()
		switch end := wEnd(v); {
		case end == cur.endSec:
			d.Count = wCount(v)
		case end > cur.endSec: // a newer window exists; count there, as Take does
			d.Count, d.end = wCount(v), end*int64(time.Second)
		}
	}
	d.Allowed = d.Count+w.N <= w.Limit
	return d
}

// giveBackLocked undoes a take TakeAll committed in d's window.
func (m *Memory) giveBackLocked(w Want, d Decision) {
	sh, h := m.lookup(w.Scope, w.Key)
	e := sh.tab.Load().get(h)
	endSec := d.end / int64(time.Second)
	for {
		v := e.w.Load()
		if wEnd(v) != endSec {
			return
		}
		if e.w.CompareAndSwap(v, pack(endSec, max(wCount(v)-w.N, 0))) {
			return
		}
	}
}
