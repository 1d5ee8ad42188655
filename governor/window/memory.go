package window

import (
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
// cache line and 100,000 tenants fit in about 3 MB — small enough that the
// table's pages stay in the TLB, which on a VM matters as much as the cache.
// The key text lives in a cold map read only for listings. Two keys
// colliding in 64 bits would share a window: at a million live keys the odds
// are about 1 in 10^7, which a rate limiter accepts in exchange for an
// allocation-free lookup.
type Memory struct {
	clk    clock.Clock
	shards [shardCount]shard
	// bounds caches the current window per size so that a new key does not
	// redo calendar arithmetic; index by sizeIndex.
	bounds [4]atomic.Pointer[span]
}

type shard struct {
	mu    sync.Mutex
	slots []slot          // len is a power of two; h == 0 marks an empty slot
	meta  map[uint64]meta // cold: read only for listings
	used  int
	_     [8]byte // keep neighbouring shards' locks on separate cache lines
}

// slot is one window. Window ends are whole seconds (every boundary of
// every supported size is), so the end fits in 32 bits until 2106 and the
// count in the other 32: limits are at most 2^31-1 by policy validation.
type slot struct {
	h uint64
	w uint64 // end unix second << 32 | count
}

func (e *slot) end() int64   { return int64(e.w >> 32) }
func (e *slot) count() int64 { return int64(uint32(e.w)) }
func (e *slot) set(endSec, count int64) {
	e.w = uint64(endSec)<<32 | uint64(uint32(count))
}

type meta struct {
	scope *Scope
	key   string
}

// span is a cached window, in unix nanoseconds, with its end in seconds.
type span struct{ start, end, endSec int64 }

const initialSlots = 16

// NewMemory returns an empty in-memory counter reading time from clk.
func NewMemory(clk clock.Clock) *Memory {
	m := &Memory{clk: clk}
	for i := range m.shards {
		m.shards[i].init(initialSlots)
	}
	return m
}

func sizeIndex(w policy.Window) int {
	switch w {
	case policy.WindowSecond:
		return 0
	case policy.WindowMinute:
		return 1
	case policy.WindowHour:
		return 2
	default:
		return 3
	}
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

func (sh *shard) init(n int) {
	sh.slots = make([]slot, n)
	if sh.meta == nil {
		sh.meta = make(map[uint64]meta)
	}
	sh.used = 0
}

// find returns the index of h's slot, or of the empty slot where it would go.
func (sh *shard) find(h uint64) int {
	mask := uint64(len(sh.slots) - 1)
	// The shard was chosen by the low bits, so probe from the high ones.
	i := (h >> 32) & mask
	for {
		if c := sh.slots[i].h; c == h || c == 0 {
			return int(i)
		}
		i = (i + 1) & mask
	}
}

// insert claims the empty slot i for h, growing the table past 3/4 full.
func (sh *shard) insert(i int, h uint64, s *Scope, key []byte) int {
	if (sh.used+1)*4 > len(sh.slots)*3 {
		sh.rehash(len(sh.slots) * 2)
		i = sh.find(h)
	}
	sh.slots[i].h = h
	sh.meta[h] = meta{scope: s, key: string(key)}
	sh.used++
	return i
}

// rehash moves every occupied slot into a fresh table of n slots.
func (sh *shard) rehash(n int) {
	old := sh.slots
	sh.init(n)
	for j := range old {
		if old[j].h == 0 {
			continue
		}
		i := sh.find(old[j].h)
		sh.slots[i] = old[j]
		sh.used++
	}
}

// current returns the window of size w holding now.
func (m *Memory) current(w policy.Window, now time.Time) *span {
	n := now.UnixNano()
	p := &m.bounds[sizeIndex(w)]
	if sp := p.Load(); sp != nil && n >= sp.start && n < sp.end {
		return sp
	}
	s, e := Bounds(now, w)
	sp := &span{start: s.UnixNano(), end: e.UnixNano(), endSec: e.Unix()}
	p.Store(sp)
	return sp
}

func (m *Memory) lookup(s *Scope, key []byte) (*shard, uint64) {
	h := keyHash(s, key)
	return &m.shards[h&(shardCount-1)], h
}

// Take implements Counter.
func (m *Memory) Take(s *Scope, key []byte, limit, n int64, now time.Time) Decision {
	cur := m.current(s.Window, now)
	sh, h := m.lookup(s, key)
	d := Decision{Limit: limit, start: cur.start, end: cur.end, loc: now.Location()}
	sh.mu.Lock()
	i := sh.find(h)
	if sh.slots[i].h == 0 {
		i = sh.insert(i, h, s, key)
	}
	e := &sh.slots[i]
	count, endSec := e.count(), e.end()
	switch {
	case endSec < cur.endSec:
		// The old window expired (or the slot is new): a fresh full
		// allowance in the window holding now.
		count, endSec = 0, cur.endSec
	case endSec > cur.endSec:
		// A request stamped just before a boundary reached the lock after
		// one stamped just after it: count it in the newer window rather
		// than wind the window back.
		d.end = endSec * int64(time.Second)
	}
	if count+n <= limit {
		count += n
		d.Allowed = true
	}
	e.set(endSec, count)
	sh.mu.Unlock()
	d.Count = count
	return d
}

// Peek implements Counter.
func (m *Memory) Peek(s *Scope, key []byte, limit int64) Decision {
	now := m.clk.Now()
	cur := m.current(s.Window, now)
	sh, h := m.lookup(s, key)
	d := Decision{Limit: limit, start: cur.start, end: cur.end, loc: now.Location()}
	sh.mu.Lock()
	if e := &sh.slots[sh.find(h)]; e.h != 0 && e.end() >= cur.endSec {
		d.Count = e.count()
	}
	sh.mu.Unlock()
	d.Allowed = d.Count < limit
	return d
}

// Refund implements Counter.
func (m *Memory) Refund(s *Scope, key []byte, start time.Time, n int64) {
	_, end := Bounds(start, s.Window)
	now := m.clk.Now()
	if !now.Before(end) {
		return // that window is over; a later one never gets credit
	}
	sh, h := m.lookup(s, key)
	sh.mu.Lock()
	if e := &sh.slots[sh.find(h)]; e.h != 0 && e.end() == end.Unix() {
		e.set(end.Unix(), max(e.count()-n, 0))
	}
	sh.mu.Unlock()
}

// Reset implements Counter.
func (m *Memory) Reset(s *Scope, key []byte) {
	sh, h := m.lookup(s, key)
	sh.mu.Lock()
	if e := &sh.slots[sh.find(h)]; e.h != 0 {
		e.set(e.end(), 0)
	}
	sh.mu.Unlock()
}

// ResetScope implements Counter.
func (m *Memory) ResetScope(s *Scope) {
	m.each(func(e *slot, md meta) {
		if md.scope.hash == s.hash {
			e.set(e.end(), 0)
		}
	})
}

// Usage implements Counter.
func (m *Memory) Usage(s *Scope) []Usage {
	now := m.clk.Now()
	nowSec := now.Unix()
	var out []Usage
	m.each(func(e *slot, md meta) {
		if md.scope.hash != s.hash || e.end() <= nowSec {
			return
		}
		end := time.Unix(e.end(), 0).In(now.Location())
		start, _ := Bounds(end.Add(-time.Nanosecond), s.Window)
		out = append(out, Usage{Scope: s.Name, Window: s.Window, Key: md.key, Count: e.count(), Start: start, End: end})
	})
	return out
}

// Sweep drops every expired window, so that keys seen once (a tenant that
// called yesterday) do not stay in memory. Run it periodically.
func (m *Memory) Sweep() int {
	nowSec := m.clk.Now().Unix()
	dropped := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		expired := 0
		for j := range sh.slots {
			if e := &sh.slots[j]; e.h != 0 && e.end() <= nowSec {
				delete(sh.meta, e.h)
				*e = slot{}
				expired++
			}
		}
		if expired > 0 {
			// Linear probing cannot just blank a slot without breaking the
			// probe chains behind it: the blanked slots are dropped by
			// rebuilding the shard, off the hot path.
			sh.used -= expired
			size := initialSlots
			for sh.used*4 > size*3 {
				size *= 2
			}
			sh.rehash(size)
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

func (m *Memory) each(f func(*slot, meta)) {
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for j := range sh.slots {
			if e := &sh.slots[j]; e.h != 0 {
				f(e, sh.meta[e.h])
			}
		}
		sh.mu.Unlock()
	}
}
