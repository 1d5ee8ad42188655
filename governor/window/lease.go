package window

import (
	"sync/atomic"

	"github.com/warden-dev/warden/internal/percpu"
)

// Leases let a key taken on several cores at once be counted without every
// take writing the window's one cache line. A line written by two cores
// moves between them on every write, so a single hot window (a pool's rate,
// one busy tenant) admits less with two cores than with one. With more than
// one processor, each keeps a small table of leases: credit taken from a
// window ahead of time, in one add, and then spent by that processor's
// takes on its own cache line.
//
// The window's count includes leased credit, so the limit is never passed.
// Nothing is refused while credit is left anywhere: a take the window
// refuses takes one unit from another processor's lease before giving up.
// Peek, Usage, Reset and TakeAll subtract or reclaim outstanding credit, and
// a caller whose limit is below the count (a reload lowered it) reclaims it
// before being judged. Only the Count of an admitted take (which the pool
// window-count gauge shows) counts other processors' unspent credit as used,
// erring on the side of the limit by at most what they hold. Leases stay
// small: at most leaseMax, and at most 1/(leaseShare × processors) of what
// the window has left, so none is granted near the limit and a window's
// last takes are counted one by one.
//
// A key leases only when it repeats on a processor: a take on a key whose
// lease entry belongs to another key claims the entry (when it holds no
// live credit) and goes to the window; the key's next take there leases.
// 100,000 tenants taken in turn therefore never lease, and cost one store
// in a processor-private line each.
const (
	leaseSlots = 256 // per processor, direct-mapped by key hash: 4 KB
	leaseMax   = 256
	leaseShare = 4
)

// leaseEntry is one lease. Only code pinned to the table's processor
// (percpu.Pin) changes h or adds credit; other processors only take credit
// away (steal, reclaim), with a compare-and-swap on w. Every grant bumps the
// generation, so a processor that read w and then h cannot spend credit
// granted to the entry's next key.
type leaseEntry struct {
	h atomic.Uint64
	w atomic.Uint64 // window end unix second << 32 | generation << 16 | credit
}

type leaseTable struct {
	e [leaseSlots]leaseEntry
}

func lEnd(v uint64) int64     { return int64(v >> 32) }
func lGen(v uint64) uint64    { return v >> 16 & 0xffff }
func lCredit(v uint64) int64  { return int64(v & 0xffff) }
func leaseIndex(h uint64) int { return int(h>>8) & (leaseSlots - 1) }

func lPack(endSec int64, gen uint64, credit int64) uint64 {
	return uint64(endSec)<<32 | (gen&0xffff)<<16 | uint64(credit)
}

// newLeases returns one lease table per processor, or nil when there is
// one processor: nothing to share a line with.
func newLeases() []leaseTable {
	if n := percpu.Stripes(); n > 1 {
		return make([]leaseTable, n)
	}
	return nil
}

// takeLeased tries to admit n takes of h in the window ending at curEnd
// from this processor's lease, taking a new lease from the window (with the
// takes) when h repeats here and its credit ran out. ok false means nothing
// was taken: go to the window.
func (m *Memory) takeLeased(sh *shard, h uint64, curEnd, limit, n int64) (count int64, ok bool) {
	p := percpu.Pin()
	count, ok, back, backEnd := m.takePinned(&m.leases[p&(len(m.leases)-1)].e[leaseIndex(h)], sh, h, curEnd, limit, n)
	percpu.Unpin()
	if back > 0 {
		sh.giveBack(h, backEnd, back) // takes the shard's lock: never while pinned
	}
	return count, ok
}

// takePinned is takeLeased's work on le, this processor's entry for h,
// while pinned: nobody else renames le or adds credit to it; others may
// only take credit away. back > 0 is what the window ending at backEnd
// counted and must be given back once unpinned.
func (m *Memory) takePinned(le *leaseEntry, sh *shard, h uint64, curEnd, limit, n int64) (count int64, ok bool, back, backEnd int64) {
	if le.h.Load() != h {
		v := le.w.Load()
		switch {
		case lCredit(v) == 0:
			le.h.Store(h)
		case lEnd(v) < curEnd:
			// Credit of a window that is over: worth nothing, but drop it
			// (new generation) before the entry names another key, or a
			// late-stamped take of that key could spend it.
			if le.w.CompareAndSwap(v, lPack(lEnd(v), lGen(v)+1, 0)) {
				le.h.Store(h)
			}
		}
		return 0, false, 0, 0
	}
	e := sh.tab.Load().get(h)
	if e == nil {
		return 0, false, 0, 0
	}
	w := e.w.Load()
	if wEnd(w) > curEnd {
		return 0, false, 0, 0 // a late-stamped take: the window's own path handles it
	}
	used := int64(0)
	if wEnd(w) == curEnd {
		used = wCount(w)
	}
	// The window's count includes every processor's credit, so while it is
	// within this caller's limit, spending credit keeps the admitted within
	// it too. (A lease taken under a higher limit, before a reload lowered
	// it, must not admit past the new one.)
	if wEnd(w) == curEnd && used <= limit {
		for {
			v := le.w.Load()
			if lEnd(v) != curEnd || lCredit(v) < n {
				break
			}
			if le.w.CompareAndSwap(v, v-uint64(n)) {
				return max(used-(lCredit(v)-n), 0), true, 0, 0
			}
		}
	}
	if n > leaseMax || limit >= addLimit {
		return 0, false, 0, 0
	}
	chunk := min(leaseMax, (limit-used-n)/(leaseShare*int64(len(m.leases))))
	if chunk < 2 {
		return 0, false, 0, 0
	}
	c, allowed, endSec, done := take(e, curEnd, limit, n+chunk)
	switch {
	case !done:
		if endSec != 0 {
			return 0, false, n + chunk, endSec
		}
		return 0, false, 0, 0
	case !allowed:
		return 0, false, 0, 0
	case endSec != curEnd:
		// Counted in a newer window than this take's (see take): keep the
		// take, return the lease.
		return c - chunk, true, chunk, endSec
	}
	for {
		v := le.w.Load()
		credit := chunk
		if lEnd(v) == curEnd {
			credit += lCredit(v)
		}
		if le.w.CompareAndSwap(v, lPack(curEnd, lGen(v)+1, credit)) {
			return c - credit, true, 0, 0
		}
	}
}

// steal takes n units of credit for h in the window ending at curEnd from
// any processor's lease, for a take the window itself refused.
func (m *Memory) steal(h uint64, curEnd, n int64) bool {
	for i := range m.leases {
		le := &m.leases[i].e[leaseIndex(h)]
		for {
			// w before h: credit granted to another key after the h check
			// carries a newer generation, and the swap fails.
			v := le.w.Load()
			if lEnd(v) != curEnd || lCredit(v) < n || le.h.Load() != h {
				break
			}
			if le.w.CompareAndSwap(v, v-uint64(n)) {
				return true
			}
		}
	}
	return false
}

// leased is the credit leases hold for h in the window ending at endSec.
func (m *Memory) leased(h uint64, endSec int64) int64 {
	total := int64(0)
	for i := range m.leases {
		le := &m.leases[i].e[leaseIndex(h)]
		if v := le.w.Load(); lEnd(v) == endSec && le.h.Load() == h {
			total += lCredit(v)
		}
	}
	return total
}

// reclaim empties h's leases in the window ending at endSec (in any window
// when endSec is -1) and returns the credit they held.
func (m *Memory) reclaim(h uint64, endSec int64) int64 {
	total := int64(0)
	for i := range m.leases {
		le := &m.leases[i].e[leaseIndex(h)]
		for {
			v := le.w.Load()
			if lCredit(v) == 0 || (endSec >= 0 && lEnd(v) != endSec) || le.h.Load() != h {
				break
			}
			if le.w.CompareAndSwap(v, lPack(lEnd(v), lGen(v), 0)) {
				total += lCredit(v)
				break
			}
		}
	}
	return total
}
