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
// side of the limit). A new key its scope's cap refuses (Overflow) refuses
// the whole call; when that cap may be held by expired keys they are swept
// out first (keycap.go) and the call tried again.
func (m *Memory) TakeAll(ws []Want, now time.Time, out []Decision) bool {
	// Each key is hashed once; requests name a handful of windows, so the
	// hashes stay on the stack.
	var buf [16]uint64
	hs := buf[:0]
	var mask uint64 // shardCount is 64: one bit per shard
	for _, w := range ws {
		h := keyHash(w.Scope, w.Key)
		hs = append(hs, h)
		mask |= 1 << (h & (shardCount - 1)) // the bit of m.shardOf(h)
	}
	if m.takeAllOnce(ws, hs, mask, now, out) {
		return true
	}
	swept := false
	for i, w := range ws {
		if out[i].Overflow && m.makeRoom(m.keysOf(w.Scope), m.spans.current(w.Scope.Window, now)) {
			swept = true
		}
	}
	return swept && m.takeAllOnce(ws, hs, mask, now, out)
}

// takeAllOnce is TakeAll's work under the locks of the shards in mask.
func (m *Memory) takeAllOnce(ws []Want, hs []uint64, mask uint64, now time.Time, out []Decision) bool {
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
		out[i] = m.peekLocked(w, hs[i], now)
		all = all && out[i].Allowed
	}
	if !all {
		return false
	}
	for i, w := range ws {
		e := m.shardOf(hs[i]).slotLocked(hs[i], w.Scope, w.Key, m.keysOf(w.Scope))
		var count, endSec int64
		ok := false
		if e == nil {
			// Another shard's insert took the scope's last place since
			// the check.
			out[i].Overflow = true
		} else {
			count, ok, endSec, _ = take(e, out[i].end/int64(time.Second), w.Limit, w.N)
		}
		if ok {
			out[i].Count = count
			continue
		}
		for j := range i {
			m.shardOf(hs[j]).giveBackLocked(hs[j], out[j].end/int64(time.Second), ws[j].N)
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

// peekLocked decides w, whose key hashes to h, without taking: the
// window's count and whether w.N more fit. The shard's lock must be held.
// Credit leased ahead is counted in the window but admits nobody here: it
// is brought back first, so the window is judged by what was admitted.
func (m *Memory) peekLocked(w Want, h uint64, now time.Time) Decision {
	cur := m.spans.current(w.Scope.Window, now)
	d := Decision{Limit: w.Limit, start: cur.start, end: cur.end, loc: now.Location()}
	sh := m.shardOf(h)
	if c := m.reclaim(h, cur.endSec); c > 0 {
		sh.giveBackLocked(h, cur.endSec, c)
	}
	e := sh.tab.Load().get(h)
	if e == nil {
		if ks := m.keysOf(w.Scope); ks != nil && ks.held.Load() >= int64(w.Scope.MaxKeys) {
			d.Overflow = true
			return d
		}
	} else {
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
