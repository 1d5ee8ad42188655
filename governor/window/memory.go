package window

import (
	"iter"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/policy"
)

const shardCount = 64 // a power of two; enough to keep two cores off each other's locks

// Memory is the in-process Counter: sharded open-addressing tables keyed by
// a 64-bit xxhash of scope and key. A window is 16 bytes inline in the table
// (hash; end second and count packed in one word), so a lookup touches one
// cache line and 100,000 tenants fit in 2 MB. The key text lives in a
// cold map read only for listings. Two keys colliding in 64 bits would share
// a window: at a million live keys the odds are about 1 in 10^7, which a rate
// limiter accepts in exchange for an allocation-free lookup.
//
// A take on a known key is lock-free: one atomic add on the window's word
// (a compare-and-swap when the window rolls over), in the cache line the
// lookup already brought in; a refusal of a full window writes nothing. A
// mutex around that would cost a second locked instruction, and on a table
// larger than the cache each locked instruction waits out the lookup's miss. The shard's
// mutex is taken only to insert a key or to rebuild the table (growth,
// sweep); a rebuild marks every old slot moved before publishing the new
// table, so a take racing with it fails its swap and retries on the new one.
//
// With more than one processor, a key taken again and again on one of them
// is counted from a per-processor lease instead (lease.go), so that cores
// taking the same key do not move its line between them on every take.
//
// A scope with MaxKeys holds at most that many keys (keycap.go).
type Memory struct {
	clk    clock.Clock
	shards [shardCount]shard
	spans  spans
	leases []leaseTable // per processor (lease.go); nil with one processor

	keys   atomic.Pointer[map[uint64]*scopeKeys] // per capped key space; copied on write
	keysMu sync.Mutex                            // serialises writers of keys
}

type shard struct {
	mu   sync.Mutex // inserts and rebuilds; meta
	tab  atomic.Pointer[table]
	meta map[uint64]meta // cold: read only for listings
	used int
	_    [32]byte // 64 bytes in all: neighbouring shards' locks on separate cache lines
}

type table struct {
	slots []slot // len is a power of two; h == 0 marks an empty slot
}

// slot is one window. Window ends are whole seconds (every boundary of
// every supported size is), so the end fits in 32 bits until 2106, and the
// count in 31: limits are at most 2^31-1 by policy validation. The top bit
// of the low half marks a slot whose table is being replaced.
type slot struct {
	h atomic.Uint64
	w atomic.Uint64 // end unix second << 32 | moved << 31 | count
}

const movedBit = 1 << 31

func wEnd(w uint64) int64   { return int64(w >> 32) }
func wCount(w uint64) int64 { return int64(uint32(w) &^ movedBit) }
func pack(endSec, count int64) uint64 {
	return uint64(endSec)<<32 | uint64(uint32(count))&^movedBit
}

type meta struct {
	scope *Scope
	keys  *scopeKeys // counts this key against its scope's cap; nil: not counted
	key   string
}

const initialSlots = 16

// NewMemory returns an empty in-memory counter reading time from clk.
func NewMemory(clk clock.Clock) *Memory {
	m := &Memory{clk: clk, leases: newLeases()}
	m.keys.Store(&map[uint64]*scopeKeys{})
	for i := range m.shards {
		m.shards[i].meta = make(map[uint64]meta)
		m.shards[i].tab.Store(&table{slots: make([]slot, initialSlots)})
	}
	return m
}

func scopeHash(name string, w policy.Window) uint64 {
	return xxhash.Sum64String(name) ^ uint64(w)*0x9E3779B97F4A7C15
}

func keyHash(s *Scope, key []byte) uint64 {
	h := xxhash.Sum64(key)
	// Mix the scope in with a multiply so that scope and key bits interact
	// rather than cancel; then keep 0 free to mark empty slots.
	h = (h ^ s.hash) * 0xff51afd7ed558ccd
	if h == 0 {
		h = 1
	}
	return h
}

// find returns the index of h's slot, or of the empty slot where it would go.
func (t *table) find(h uint64) int {
	mask := uint64(len(t.slots) - 1)
	// The shard was chosen by the low bits, so probe from the high ones.
	i := (h >> 32) & mask
	for {
		if c := t.slots[i].h.Load(); c == h || c == 0 {
			return int(i)
		}
		i = (i + 1) & mask
	}
}

// get returns h's slot, or nil when h has none.
func (t *table) get(h uint64) *slot {
	if e := &t.slots[t.find(h)]; e.h.Load() == h {
		return e
	}
	return nil
}

// slotLocked returns h's slot in the current table, inserting it when
// missing, or nil when it is missing and ks (s's key count; nil: no cap)
// holds s.MaxKeys keys. sh.mu must be held. The table grows past 7/8 full:
// probes stay short at that load (four slots share a cache line), and a
// denser table keeps more of itself in the cache, which is what a lookup
// among 100,000 keys mostly waits for.
func (sh *shard) slotLocked(h uint64, s *Scope, key []byte, ks *scopeKeys) *slot {
	t := sh.tab.Load()
	i := t.find(h)
	if t.slots[i].h.Load() == h {
		return &t.slots[i]
	}
	if ks != nil && !ks.admit(s.MaxKeys) {
		return nil
	}
	if (sh.used+1)*8 > len(t.slots)*7 {
		t = sh.rebuildLocked(len(t.slots)*2, -1)
		i = t.find(h)
	}
	t.slots[i].h.Store(h)
	sh.meta[h] = meta{scope: s, keys: ks, key: string(key)}
	sh.used++
	return &t.slots[i]
}

// rebuildLocked replaces the table with one of n slots holding every
// window of the old one that ends after dropBefore (unix seconds; -1 keeps
// all). Each old slot is marked moved as it is copied, so that a lock-free
// take still working on the old table fails and retries on the new one.
func (sh *shard) rebuildLocked(n int, dropBefore int64) *table {
	old := sh.tab.Load()
	t := &table{slots: make([]slot, n)}
	used := 0
	for j := range old.slots {
		e := &old.slots[j]
		h := e.h.Load()
		if h == 0 {
			continue
		}
		w := e.w.Load()
		for !e.w.CompareAndSwap(w, w|movedBit) {
			w = e.w.Load()
		}
		if wEnd(w) <= dropBefore {
			if ks := sh.meta[h].keys; ks != nil {
				ks.held.Add(-1)
			}
			delete(sh.meta, h)
			continue
		}
		ne := &t.slots[t.find(h)]
		ne.h.Store(h)
		ne.w.Store(w &^ movedBit)
		used++
	}
	sh.used = used
	sh.tab.Store(t)
	return t
}

func (m *Memory) lookup(s *Scope, key []byte) (*shard, uint64) {
	h := keyHash(s, key)
	return m.shardOf(h), h
}

// shardOf is the shard holding hash h's window.
func (m *Memory) shardOf(h uint64) *shard { return &m.shards[h&(shardCount-1)] }

// take applies one take to e: it returns the count after it, whether it
// was allowed, the window's end, and ok false when e was moved to a new
// table: nothing was counted there (retry), unless endSec is non-zero —
// then the take was refused but the moved copy counts it, and the caller
// must give it back in the new table.
func take(e *slot, curEnd, limit, n int64) (count int64, allowed bool, endSec int64, ok bool) {
	for {
		w := e.w.Load()
		if w&movedBit != 0 {
			return 0, false, 0, false
		}
		count, endSec = wCount(w), wEnd(w)
		if endSec >= curEnd && count+n <= limit && limit < addLimit {
			// The window is current and has room: add without a
			// compare-and-swap, which under contention fails and retries
			// while an add cannot fail.
			nw := e.w.Add(uint64(n))
			switch {
			case nw&movedBit != 0:
				// Landed in a table being replaced after its copy was
				// made: nothing was counted there; retry.
				return 0, false, 0, false
			case wCount(nw) <= limit:
				return wCount(nw), true, wEnd(nw), true
			}
			// Others took the room first: give the take back. A refused
			// take is visible for the moment between the two adds, which
			// may refuse a concurrent take too: the error is on the side
			// of the limit.
			if e.w.Add(-uint64(n))&movedBit != 0 {
				// A rebuild copied the window between the two adds, with
				// this take in it: the caller gives it back in the new
				// table.
				return wCount(nw) - n, false, wEnd(nw), false
			}
			return wCount(nw) - n, false, wEnd(nw), true
		}
		if endSec < curEnd {
			// The old window expired (or the slot is new): a fresh full
			// allowance in the window holding now.
			count, endSec = 0, curEnd
		}
		// endSec > curEnd: a request stamped just before a boundary got here
		// after one stamped just after it: count it in the newer window
		// rather than wind the window back.
		if count+n > limit {
			if endSec == wEnd(w) {
				return count, false, endSec, true // refused: nothing to write
			}
			if e.w.CompareAndSwap(w, pack(endSec, count)) {
				return count, false, endSec, true
			}
			continue
		}
		if e.w.CompareAndSwap(w, pack(endSec, count+n)) {
			return count + n, true, endSec, true
		}
	}
}

// addLimit bounds the limits take may count with a plain add: concurrent
// adds can carry a window's count past its limit for a moment, and below
// 2^30 no number of them reaches the moved bit.
const addLimit = 1 << 30

// Take implements Counter.
func (m *Memory) Take(s *Scope, key []byte, limit, n int64, now time.Time) Decision {
	cur := m.spans.current(s.Window, now)
	sh, h := m.lookup(s, key)
	d := Decision{Limit: limit, start: cur.start, end: cur.end, loc: now.Location()}
	if m.leases != nil {
		if count, ok := m.takeLeased(sh, h, cur.endSec, limit, n); ok {
			d.Count, d.Allowed = count, true
			return d
		}
	}
	count, ok, endSec, overflow := m.takeWindow(sh, h, s, key, cur, limit, n)
	if overflow {
		d.Overflow = true
		return d
	}
	if !ok && m.leases != nil {
		// Refused by the window, which counts leased credit as used.
		end := max(endSec, cur.endSec)
		if count <= limit {
			// The window is within this limit with the credit counted:
			// spend some of the credit, if any processor still holds it.
			ok = m.steal(h, end, n)
		} else if c := m.reclaim(h, end); c > 0 {
			// Over this limit only by counting credit leased under a
			// higher one (the policy was reloaded with a lower rate, or
			// two callers name different limits): bring the credit back
			// and judge the window by what it admitted.
			sh.giveBack(h, end, c)
			count, ok, endSec, _ = m.takeWindow(sh, h, s, key, cur, limit, n)
		}
	}
	d.Count, d.Allowed = count, ok
	if endSec > cur.endSec {
		d.end = endSec * int64(time.Second)
	}
	return d
}

// takeWindow takes n from h's window itself (see take for the results),
// in shard sh. overflow reports that h has no window and s's cap refused
// to add one: nothing was taken.
func (m *Memory) takeWindow(sh *shard, h uint64, s *Scope, key []byte, cur *span, limit, n int64) (count int64, ok bool, endSec int64, overflow bool) {
	if e := sh.tab.Load().get(h); e != nil {
		var done bool
		if count, ok, endSec, done = take(e, cur.endSec, limit, n); done {
			return count, ok, endSec, false
		}
		if endSec != 0 {
			sh.giveBack(h, endSec, n)
			return count, ok, endSec, false
		}
	}
	// A new key, or a table being rebuilt: the lock waits the rebuild out,
	// and nothing can move the slot while it is held.
	ks := m.keysOf(s)
	for {
		sh.mu.Lock()
		e := sh.slotLocked(h, s, key, ks)
		if e != nil {
			count, ok, endSec, _ = take(e, cur.endSec, limit, n)
		}
		sh.mu.Unlock()
		if e != nil {
			return count, ok, endSec, false
		}
		if !m.makeRoom(ks, cur) {
			return 0, false, 0, true
		}
	}
}

// Peek implements Counter.
func (m *Memory) Peek(s *Scope, key []byte, limit int64) Decision {
	now := m.clk.Now()
	cur := m.spans.current(s.Window, now)
	sh, h := m.lookup(s, key)
	d := Decision{Limit: limit, start: cur.start, end: cur.end, loc: now.Location()}
	// A moved slot still holds the value it was copied with: good enough
	// for a look that changes nothing.
	if e := sh.tab.Load().get(h); e != nil {
		if w := e.w.Load(); wEnd(w) >= cur.endSec {
			d.Count = max(wCount(w)-m.leased(h, wEnd(w)), 0)
		}
	}
	d.Allowed = d.Count < limit
	return d
}

// update applies f to h's window under the shard lock (no rebuild can run,
// so no slot is moved), swapping so that lock-free takes are not lost.
func (sh *shard) update(h uint64, f func(w uint64) uint64) {
	sh.mu.Lock()
	sh.updateLocked(h, f)
	sh.mu.Unlock()
}

// updateLocked is update with sh.mu already held.
func (sh *shard) updateLocked(h uint64, f func(w uint64) uint64) {
	if e := sh.tab.Load().get(h); e != nil {
		for {
			w := e.w.Load()
			if e.w.CompareAndSwap(w, f(w)) {
				return
			}
		}
	}
}

// giveBack removes n takes from h's window ending at endSec.
func (sh *shard) giveBack(h uint64, endSec, n int64) {
	sh.mu.Lock()
	sh.giveBackLocked(h, endSec, n)
	sh.mu.Unlock()
}

// giveBackLocked is giveBack with sh.mu already held.
func (sh *shard) giveBackLocked(h uint64, endSec, n int64) {
	sh.updateLocked(h, func(w uint64) uint64 {
		if wEnd(w) != endSec {
			return w
		}
		return pack(endSec, max(wCount(w)-n, 0))
	})
}

// Refund implements Counter.
func (m *Memory) Refund(s *Scope, key []byte, start time.Time, n int64) {
	_, end := Bounds(start, s.Window)
	now := m.clk.Now()
	if !now.Before(end) {
		return // that window is over; a later one never gets credit
	}
	sh, h := m.lookup(s, key)
	sh.giveBack(h, end.Unix(), n)
}

// Reset implements Counter.
func (m *Memory) Reset(s *Scope, key []byte) {
	sh, h := m.lookup(s, key)
	sh.update(h, func(w uint64) uint64 { return pack(wEnd(w), 0) })
	m.reclaim(h, -1) // counted before the reset: spent
}

// ResetScope implements Counter.
func (m *Memory) ResetScope(s *Scope) {
	m.each(func(e *slot, md meta) bool {
		if md.scope.hash != s.hash {
			return true
		}
		for {
			w := e.w.Load()
			if e.w.CompareAndSwap(w, pack(wEnd(w), 0)) {
				break
			}
		}
		m.reclaim(e.h.Load(), -1)
		return true
	})
}

// Usage implements Counter. yield runs with one shard's lock held.
func (m *Memory) Usage(s *Scope) iter.Seq[Usage] {
	return func(yield func(Usage) bool) {
		now := m.clk.Now()
		nowSec := now.Unix()
		m.each(func(e *slot, md meta) bool {
			w := e.w.Load()
			if md.scope.hash != s.hash || wEnd(w) <= nowSec {
				return true
			}
			end := time.Unix(wEnd(w), 0).In(now.Location())
			start, _ := Bounds(end.Add(-time.Nanosecond), s.Window)
			count := max(wCount(w)-m.leased(e.h.Load(), wEnd(w)), 0)
			return yield(Usage{Scope: s.Name, Window: s.Window, Key: md.key, Count: count, Start: start, End: end})
		})
	}
}

// Sweep drops every expired window, so that keys seen once (a tenant that
// called yesterday) do not stay in memory. Run it periodically.
func (m *Memory) Sweep() int { return m.sweepBefore(m.clk.Now().Unix()) }

// sweepBefore drops every window that ends at or before nowSec (unix s).
func (m *Memory) sweepBefore(nowSec int64) int {
	dropped := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		live := 0
		for j, t := 0, sh.tab.Load(); j < len(t.slots); j++ {
			if e := &t.slots[j]; e.h.Load() != 0 && wEnd(e.w.Load()) > nowSec {
				live++
			}
		}
		if expired := sh.used - live; expired > 0 {
			// Linear probing cannot just blank a slot without breaking the
			// probe chains behind it: the table is rebuilt without them.
			size := initialSlots
			for live*8 > size*7 {
				size *= 2
			}
			sh.rebuildLocked(size, nowSec)
			dropped += expired
		}
		sh.mu.Unlock()
	}
	return dropped
}

// Len reports how many windows are held, expired or not.
func (m *Memory) Len() int {
	total := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		total += sh.used
		sh.mu.Unlock()
	}
	return total
}

// each calls f on every slot, a shard at a time under its lock, until f
// returns false.
func (m *Memory) each(f func(*slot, meta) bool) {
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		t := sh.tab.Load()
		for j := range t.slots {
			if e := &t.slots[j]; e.h.Load() != 0 && !f(e, sh.meta[e.h.Load()]) {
				sh.mu.Unlock()
				return
			}
		}
		sh.mu.Unlock()
	}
}
