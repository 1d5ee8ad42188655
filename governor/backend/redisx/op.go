package redisx

import (
	"sync"
	"time"
)

// GateKind names a gate type of the Lua library.
type GateKind byte

// Gate kinds.
const (
	// GateWindow is a fixed-window counter: admits when count+n <= limit,
	// commits by adding n (creating the key with its expiry the first time).
	GateWindow GateKind = 'w'
	// GateLease is a lease set: a sorted set of holders scored by the
	// expiry of their lease. Admits when fewer than Limit unexpired
	// holders remain after sweeping the expired ones; commits by adding
	// the holder with its expiry.
	GateLease GateKind = 'l'
	// GateRelease removes a holder from a lease set; it always admits.
	// It travels in an op of its own (Client.Release), never undone.
	GateRelease GateKind = 'r'
)

// Gate is one check of an admission.
type Gate struct {
	Kind GateKind
	// Window gate: the counter key, the key of the set indexing the
	// window's keys, and the member listed in it (the caller's key).
	Key, Index, Member string
	Limit, N           int64
	// Window gate: a counter this gate would create is refused (value
	// Overflow) while the index already lists MaxKeys members; 0: no cap.
	MaxKeys int64
	// TTLMillis is the expiry given to the counter (and index) when this
	// gate creates it: the time left in the window. Lease gate: the
	// expiry (re)set on the whole set, so an abandoned set goes away.
	TTLMillis int64
	// Lease gate: the sidecar's clock and the lease's expiry, unix ms.
	// Sidecar time decides, as for windows: Redis's clock is never read.
	NowMillis, ExpiryMillis int64
}

// Op is one admission: every gate admits and is committed, or none is. Ops
// are pooled: GetOp, add gates, Client.Admit, read Result, PutOp.
type Op struct {
	gates     []Gate
	checkOnly bool
	res       []int64
	err       error
	done      chan struct{}
	// after, when set, makes the op asynchronous: nobody waits on done;
	// the sender runs after once the batch is back and recycles the op.
	after func()
}

var opPool = sync.Pool{New: func() any { return &Op{done: make(chan struct{}, 1)} }}

// GetOp returns an empty op.
func GetOp() *Op { return opPool.Get().(*Op) }

// PutOp recycles op; it must not be used afterwards.
func PutOp(o *Op) {
	clear(o.gates)
	o.gates, o.res = o.gates[:0], o.res[:0]
	o.checkOnly, o.err, o.after = false, nil, nil
	opPool.Put(o)
}

// AddWindow adds a window gate; maxKeys > 0 caps the members of index
// (Gate.MaxKeys).
func (o *Op) AddWindow(key, index, member string, limit, n, maxKeys int64, ttl time.Duration) {
	ms := ttl.Milliseconds()
	if ms < 1 {
		ms = 1 // PX 0 is an error; the window is about to end anyway
	}
	o.gates = append(o.gates, Gate{Kind: GateWindow, Key: key, Index: index, Member: member, Limit: limit, N: n, MaxKeys: maxKeys, TTLMillis: ms})
}

// Overflow is the value of a window gate that refused to create its
// counter because the index held Gate.MaxKeys members.
const Overflow = -1

// AddLease adds a lease gate: holder joins the set key, of at most limit
// unexpired holders, with a lease that expires ttl after now.
func (o *Op) AddLease(key, holder string, limit int64, now time.Time, ttl time.Duration) {
	ms := now.UnixMilli()
	o.gates = append(o.gates, Gate{Kind: GateLease, Key: key, Member: holder, Limit: limit,
		NowMillis: ms, ExpiryMillis: ms + ttl.Milliseconds(), TTLMillis: max(ttl.Milliseconds(), 1)})
}

// CheckOnly makes the op read its gates without committing any: the caller
// wants the current values of an admission it already knows is refused.
func (o *Op) CheckOnly() { o.checkOnly = true }

// Len is the number of gates.
func (o *Op) Len() int { return len(o.gates) }

// Result is gate i's outcome: whether it admits on its own, and its value
// (a window's count or a lease set's holders, including this admission when
// every gate admitted and the op was committed; Overflow for a window gate
// its cap refused).
func (o *Op) Result(i int) (value int64, ok bool) {
	r := o.res[i]
	return r >> 1, r&1 == 1
}

// Admitted reports whether every gate admitted (and so, unless CheckOnly,
// was committed).
func (o *Op) Admitted() bool {
	for _, r := range o.res {
		if r&1 == 0 {
			return false
		}
	}
	return true
}
