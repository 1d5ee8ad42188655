package window

import (
	"sync"
	"sync/atomic"
)

// The key cap (Scope.MaxKeys) bounds what clients can make Memory hold:
// every distinct tenant or descriptor value would otherwise add a window.
//
// Memory counts, per key space (scope hash), the keys a capped take
// inserted and the table still holds, expired or not; a rebuild that drops
// one counts it out. A key is inserted only while that count is below the
// cap, so the table never holds more than the cap's keys of the scope. A
// window that ends leaves its keys in the table until a sweep, so the
// first take refused for the cap in each window sweeps the expired ones
// out and tries again: after that sweep nothing of the scope can expire
// before the window ends, so one sweep per window and scope is enough, and
// the cap is on the keys of the current window. Keys the table holds,
// expired or live, are found by the lock-free path and never refused.
//
// The count is per key space, not per Scope value: a reload builds new
// Scopes whose windows are the old ones. A take through a Scope without a
// cap inserts keys the count does not include.

// scopeKeys is the key count of one capped key space.
type scopeKeys struct {
	held atomic.Int64 // keys inserted by capped takes and still in the table

	sweepMu  sync.Mutex
	sweptEnd int64 // end (unix s) of the window last swept for this scope; guarded by sweepMu
}

// admit counts one more key against max, or reports that max are held.
// Adding first and checking after keeps two inserts racing in different
// shards from both taking the last place: one of them is refused, on the
// side of the cap.
func (k *scopeKeys) admit(max int) bool {
	if k.held.Add(1) > int64(max) {
		k.held.Add(-1)
		return false
	}
	return true
}

// keysOf returns the key count of s's key space, nil when s has no cap.
// Called only when a key is to be inserted: the map is copied on write, so
// a lookup is one atomic load.
func (m *Memory) keysOf(s *Scope) *scopeKeys {
	if s.MaxKeys <= 0 {
		return nil
	}
	if ks := (*m.keys.Load())[s.hash]; ks != nil {
		return ks
	}
	m.keysMu.Lock()
	defer m.keysMu.Unlock()
	old := *m.keys.Load()
	if ks := old[s.hash]; ks != nil {
		return ks
	}
	next := make(map[uint64]*scopeKeys, len(old)+1)
	for h, ks := range old {
		next[h] = ks
	}
	ks := &scopeKeys{}
	next[s.hash] = ks
	m.keys.Store(&next)
	return ks
}

// makeRoom drops the expired windows once per window of the scope whose
// cap refused a key, and reports whether it did (the caller tries again).
// Takes refused for the cap at once after a window starts wait for the
// sweep one of them runs.
func (m *Memory) makeRoom(ks *scopeKeys, cur *span) bool {
	ks.sweepMu.Lock()
	defer ks.sweepMu.Unlock()
	if ks.sweptEnd >= cur.endSec {
		return false
	}
	ks.sweptEnd = cur.endSec
	// Every boundary is a whole second: a window that ended by the
	// current one's start ends at or before startSec.
	m.sweepBefore(cur.start / int64(1e9))
	return true
}
