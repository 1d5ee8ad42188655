package window

import (
	"iter"
	"sync/atomic"
	"time"

	"github.com/warden-dev/warden/policy"
)

// Scope is a family of windows that share a window size and a key space:
// "tenant:ingress" at 1 s, "pool" at 60 s. Keys in different scopes never
// collide. A Scope is created once per policy and reused on the hot path.
//
// MaxKeys, when set, caps the distinct keys the scope's current window
// holds: a Take that would create a key beyond it creates nothing and
// answers Decision.Overflow. Keys already in the window keep working, and
// the count starts again with each window. Every scope whose keys come from
// clients (tenants, descriptor values) sets it, and keys the policy names
// belong in a scope of their own. Scopes of one name and window share
// their keys, and each applies its own MaxKeys (0: no cap) when it would
// add one; what the cap counts then differs (Memory counts only the keys
// capped takes added, Redis every key of the window), so callers keep one
// MaxKeys per name.
type Scope struct {
	Name    string
	Window  policy.Window
	MaxKeys int
	hash    uint64
	// redis caches the Redis key parts of the scope's current window.
	redis atomic.Pointer[redisKeys]
}

// NewScope returns the scope name with windows of size w.
func NewScope(name string, w policy.Window) *Scope {
	return &Scope{Name: name, Window: w, hash: scopeHash(name, w)}
}

// Decision is the outcome of one Take.
type Decision struct {
	Allowed bool
	// Unavailable marks a refusal made without consulting the limit: the
	// shared backend is down and backend.on_error is fail_closed. Callers
	// report it with control "upstream", not as their rate control.
	// Allowed is false whenever Unavailable is true.
	Unavailable bool
	// Overflow marks a refusal of a key the window does not hold because
	// its scope's window already holds Scope.MaxKeys keys: nothing was
	// counted or created. Callers count such takes elsewhere (an overflow
	// window). Allowed is false whenever Overflow is true.
	Overflow bool
	Limit    int64
	// Count is the window's count after the call: it includes this take when
	// allowed and excludes it when refused (refused calls never count).
	Count int64
	// start and end bound the window the decision was made in, in unix
	// nanoseconds; kept as integers so a decision costs no time arithmetic.
	start, end int64
	loc        *time.Location
}

// Start is when the decision's window began.
func (d Decision) Start() time.Time { return time.Unix(0, d.start).In(d.loc) }

// End is when the decision's window ends and its full allowance returns.
func (d Decision) End() time.Time { return time.Unix(0, d.end).In(d.loc) }

// ResetIn is the time left until End, measured from now.
func (d Decision) ResetIn(now time.Time) time.Duration { return time.Duration(d.end - now.UnixNano()) }

// Remaining is what is left of the allowance in the decision's window:
// none when the decision was a refusal because the backend is unavailable
// (nothing can be admitted until it returns, whatever the window held) or
// because the key overflowed its scope (it has no window to take from).
func (d Decision) Remaining() int64 {
	if d.Unavailable || d.Overflow {
		return 0
	}
	if r := d.Limit - d.Count; r > 0 {
		return r
	}
	return 0
}

// Usage is one live window, for the admin API.
type Usage struct {
	Scope  string
	Window policy.Window
	Key    string
	Count  int64
	Start  time.Time
	End    time.Time
}

// Counter counts takes per key in fixed windows. The memory implementation is
// per process; a shared one lives in Redis. Implementations never count a
// refused take.
type Counter interface {
	// Take adds n to key's current window at now if the window's count plus
	// n stays within limit. The caller passes now so that one request reads
	// the clock once for all of its controls.
	Take(s *Scope, key []byte, limit, n int64, now time.Time) Decision
	// Refund gives back n takes to key's window that started at start. It is
	// a no-op once that window has ended: a later window never gets credit.
	Refund(s *Scope, key []byte, start time.Time, n int64)
	// Peek reports key's current window without taking.
	Peek(s *Scope, key []byte, limit int64) Decision
	// Reset restores the full allowance of key's current window without
	// moving its boundary.
	Reset(s *Scope, key []byte)
	// ResetScope does Reset for every key of the scope.
	ResetScope(s *Scope)
	// Usage yields the live windows of the scope, one at a time, so that a
	// listing costs memory in what the caller keeps, not in the number of
	// keys. yield may run with the counter's locks held: it must not call
	// the counter.
	Usage(s *Scope) iter.Seq[Usage]
	// TakeAll takes from every window of ws at now, or from none: all
	// admit only when each window has room for its N (and, for a key the
	// window does not hold yet, its scope room for one more key). out (len(ws) long)
	// gets one decision per window: Allowed says whether that window alone
	// had room, Count includes this take only when all admitted. The
	// windows must be distinct (no scope and key twice). It reports
	// whether all admitted.
	TakeAll(ws []Want, now time.Time, out []Decision) bool
}

// Want is one window of a TakeAll.
type Want struct {
	Scope *Scope
	Key   []byte
	Limit int64
	N     int64
}
