package window

import "sync"

// fullCache remembers windows Redis said were full, so that the refusals
// that follow are answered locally without a round trip (envoyproxy/
// ratelimit's local cache). A refusal from the cache is still a refusal and
// is never counted. An entry lives until its window ends, but at most
// recheck after Redis last said full: a reset or refund made through
// another sidecar is seen within that time instead of at the window's end
// (a day window would otherwise stay refused for hours after an admin
// reset elsewhere). Its keys come from clients, so it holds at most
// fullCacheMax entries: a window refused when the cache is full of live
// entries is asked about again next time.
type fullCache struct {
	shards [16]fullShard
}

type fullShard struct {
	mu      sync.RWMutex
	m       map[uint64]fullEntry
	scanned int64    // when a full shard was last cleared of entries out of force, unix ns
	_       [24]byte // keep shards' locks on separate cache lines
}

type fullEntry struct {
	scope uint64 // scope hash, for ResetScope
	end   int64  // window end, unix ns
	until int64  // ask Redis again from here, unix ns
	count int64
}

// fullCacheMax bounds the cache (about 100 bytes an entry): far more
// windows than are refused at once by anything but a flood of keys.
const fullCacheMax = 16 * 1024

func (c *fullCache) shard(h uint64) *fullShard { return &c.shards[h&15] }

// refused reports whether window h ending at end is known full for a take
// of n at now (unix ns), and its count.
func (c *fullCache) refused(h uint64, end, now, limit, n int64) (int64, bool) {
	sh := c.shard(h)
	sh.mu.RLock()
	e, ok := sh.m[h]
	sh.mu.RUnlock()
	if !ok || e.end != end || now >= e.until || e.count+n <= limit {
		return 0, false
	}
	return e.count, true
}

// mark records that window h (of scope) ending at end held count at now
// and refused.
func (c *fullCache) mark(h, scope uint64, end, now, count, recheck int64) {
	sh := c.shard(h)
	sh.mu.Lock()
	if sh.m == nil {
		sh.m = make(map[uint64]fullEntry)
	}
	if _, ok := sh.m[h]; !ok && len(sh.m) >= fullCacheMax/len(c.shards) {
		// Entries last at most recheck: clearing a full shard more
		// often than that would scan it for nothing on every refusal.
		if now-sh.scanned >= recheck {
			sh.scanned = now
			for k, e := range sh.m {
				if now >= e.until {
					delete(sh.m, k)
				}
			}
		}
		if len(sh.m) >= fullCacheMax/len(c.shards) {
			sh.mu.Unlock()
			return
		}
	}
	sh.m[h] = fullEntry{scope: scope, end: end, until: min(end, now+recheck), count: count}
	sh.mu.Unlock()
}

func (c *fullCache) forget(h uint64) {
	sh := c.shard(h)
	sh.mu.Lock()
	delete(sh.m, h)
	sh.mu.Unlock()
}

func (c *fullCache) forgetScope(scope uint64) {
	c.drop(func(e fullEntry) bool { return e.scope == scope })
}

// sweep drops entries no longer in force at now.
func (c *fullCache) sweep(now int64) {
	c.drop(func(e fullEntry) bool { return now >= e.until })
}

func (c *fullCache) drop(f func(fullEntry) bool) {
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		for h, e := range sh.m {
			if f(e) {
				delete(sh.m, h)
			}
		}
		sh.mu.Unlock()
	}
}
