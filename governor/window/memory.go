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
// a 64-bit xxhash of scope and key. The hot part of a window (hash, end,
// count) sits inline in the table so that a lookup touches one cache line;
// the key text lives in a parallel array read only for listings. Two keys
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

type slot struct {
	h     uint64
	start int64 // unix nanos
	end   int64
	count int64
}

type meta struct {
	scope *Scope
	key   string
}

type span struct{ start, end int64 }

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

// rehash moves every slot kept by keep (all when nil) into a table of n slots.
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
func (m *Memory) current(w policy.Window, now time.Time) (int64, int64) {
	n := now.UnixNano()
	p := &m.bounds[sizeIndex(w)]
	if sp := p.Load(); sp != nil && n >= sp.start && n < sp.end {
		return sp.start, sp.end
	}
	s, e := Bounds(now, w)
	sp := &span{s.UnixNano(), e.UnixNano()}
	p.Store(sp)
	return sp.start, sp.end
}

func (m *Memory) lookup(s *Scope, key []byte) (*shard, uint64) {
	h := keyHash(s, key)
	return &m.shards[h&(shardCount-1)], h
}

// Take implements Counter.
func (m *Memory) Take(s *Scope, key []byte, limit, n int64, now time.Time) Decision {
	start, end := m.current(s.Window, now)
	sh, h := m.lookup(s, key)
	sh.mu.Lock()
	i := sh.find(h)
	if sh.slots[i].h == 0 {
		i = sh.insert(i, h, s, key)
		sh.slots[i].start, sh.slots[i].end = start, end
	}
	e := &sh.slots[i]
	if e.end <= now.UnixNano() {
		// The old window expired: a fresh full allowance, aligned anew.
		e.start, e.end, e.count = start, end, 0
	}
	d := Decision{Limit: limit, loc: now.Location()}
	if e.count+n <= limit {
		e.count += n
		d.Allowed = true
	}
	d.Count, d.start, d.end = e.count, e.start, e.end
	sh.mu.Unlock()
	return d
}

// Peek implements Counter.
func (m *Memory) Peek(s *Scope, key []byte, limit int64) Decision {
	now := m.clk.Now()
	start, end := m.current(s.Window, now)
	sh, h := m.lookup(s, key)
	d := Decision{Limit: limit, start: start, end: end, loc: now.Location()}
	sh.mu.Lock()
	if e := &sh.slots[sh.find(h)]; e.h != 0 && e.end > now.UnixNano() {
		d.start, d.end, d.Count = e.start, e.end, e.count
	}
	sh.mu.Unlock()
	d.Allowed = d.Count < limit
	return d
}

// Refund implements Counter.
func (m *Memory) Refund(s *Scope, key []byte, start time.Time, n int64) {
	sh, h := m.lookup(s, key)
	now := m.clk.Now().UnixNano()
	sh.mu.Lock()
	if e := &sh.slots[sh.find(h)]; e.h != 0 && e.start == start.UnixNano() && e.end > now {
		e.count -= n
		if e.count < 0 {
			e.count = 0
		}
	}
	sh.mu.Unlock()
}

// Reset implements Counter.
func (m *Memory) Reset(s *Scope, key []byte) {
	sh, h := m.lookup(s, key)
	sh.mu.Lock()
	if e := &sh.slots[sh.find(h)]; e.h != 0 {
		e.count = 0
	}
	sh.mu.Unlock()
}

// ResetScope implements Counter.
func (m *Memory) ResetScope(s *Scope) {
	m.each(func(e *slot, md *meta) {
		if md.scope.hash == s.hash {
			e.count = 0
		}
	})
}

// Usage implements Counter.
func (m *Memory) Usage(s *Scope) []Usage {
	now := m.clk.Now()
	n := now.UnixNano()
	var out []Usage
	m.each(func(e *slot, md *meta) {
		if md.scope.hash != s.hash || e.end <= n {
			return
		}
		out = append(out, Usage{
			Scope: s.Name, Window: s.Window, Key: md.key, Count: e.count,
			Start: time.Unix(0, e.start).In(now.Location()), End: time.Unix(0, e.end).In(now.Location()),
		})
	})
	return out
}

// Sweep drops every expired window, so that keys seen once (a tenant that
// called yesterday) do not stay in memory. Run it periodically.
func (m *Memory) Sweep() int {
	n := m.clk.Now().UnixNano()
	dropped := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		expired := 0
		for j := range sh.slots {
			if sh.slots[j].h != 0 && sh.slots[j].end <= n {
				expired++
			}
		}
		if expired > 0 {
			// Linear probing cannot just blank a slot without breaking the
			// probe chains behind it; rebuilding the shard is simple and
			// runs off the hot path.
			for j := range sh.slots {
				if sh.slots[j].h != 0 && sh.slots[j].end <= n {
					delete(sh.meta, sh.slots[j].h)
					sh.slots[j] = slot{}
				}
			}
			size := initialSlots
			for (sh.used-expired)*4 > size*3 {
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

func (m *Memory) each(f func(*slot, *meta)) {
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for j := range sh.slots {
			if sh.slots[j].h != 0 {
				md := sh.meta[sh.slots[j].h]
				f(&sh.slots[j], &md)
			}
		}
		sh.mu.Unlock()
	}
}
