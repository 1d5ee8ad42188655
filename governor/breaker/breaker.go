// Package breaker is warden's circuit breaker: one per target, per process
// (SPEC §4). A proxy uses it in two steps — Allow before forwarding, then
// Ticket.Done with the classified outcome — so the breaker never wraps the
// call and the hot path allocates nothing.
//
// The closed-state path is lock-free: Allow is one atomic load, Done a few
// atomic operations on the current time bucket, whose request count is
// split per processor so that parallel callers do not share a cache line.
// The mutex is taken only for state transitions and once per bucket
// rotation, which is what makes "half-open admits exactly one probe" easy
// to reason about while keeping the common case cheap.
//
// Reading the clock costs more than everything else on Done's path (about
// 40 ns for a monotonic read on a typical cloud VM), so with the real clock
// the breaker does not read it per request: it caches the current bucket
// number and arms a timer for the bucket's end, whose callback invalidates
// the cache. An idle breaker has no timer armed; the next request re-reads
// the clock and re-arms it. Events landing in the callback's scheduling
// delay (microseconds) count in the previous bucket, which is noise against
// a bucket of window/20. With any other clock (the Fake in tests) every
// event reads the clock, so tests need no synchronisation with timers.
package breaker

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/internal/percpu"
	"github.com/warden-dev/warden/policy"
)

// numBuckets splits the rolling window. With 20 buckets the counted span is
// between 95% and 100% of the configured window, close enough that operators
// reading "30s" are not surprised, without storing one entry per request.
const numBuckets = 20

// Defaults from SPEC §4, applied only when a zero value would make no sense
// (the policy loader normally fills them in already).
const (
	defaultWindow = 30 * time.Second
	defaultOpen   = 5 * time.Second
)

// halfOpenRetryAfter is the hint given while a probe is in flight: the probe
// may close the breaker at any moment, so a short hint is the honest one.
const halfOpenRetryAfter = time.Second

// State is the externally visible breaker state. The values are those of the
// warden_breaker_state gauge.
type State uint8

// Breaker states.
const (
	Closed   State = 0
	HalfOpen State = 1
	Open     State = 2
)

// String returns the admin API spelling: closed, half_open or open.
func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case HalfOpen:
		return "half_open"
	case Open:
		return "open"
	}
	return "unknown"
}

// Outcome is what a call admitted by Allow turned out to be. The zero value
// is Neutral so a forgotten classification can neither trip nor heal the
// breaker.
type Outcome uint8

// Outcomes.
const (
	// Neutral is neither success nor failure (the client cancelled). It
	// still releases a half-open probe slot.
	Neutral Outcome = iota
	Success
	Failure
)

// The state word packs a generation counter above a 2-bit phase. Every
// transition bumps the generation, so a Ticket (which carries the word it
// was issued under) can tell with one comparison whether its result still
// belongs to the current state; this is how stale results are ignored.
const (
	phClosed  uint64 = 0
	phProbing uint64 = 1 // half-open, the probe is out
	phOpen    uint64 = 2
	phIdle    uint64 = 3 // half-open, probe slot free (open expired or probe was neutral)
	phMask    uint64 = 3
	genUnit   uint64 = 4
)

func publicState(word uint64) State {
	switch word & phMask {
	case phClosed:
		return Closed
	case phOpen:
		return Open
	}
	return HalfOpen
}

// Options are optional hooks.
type Options struct {
	// OnStateChange is called on every change of the public State. It runs
	// with the breaker's transition lock held so calls arrive in order; it
	// must not call Allow, Done or Reset on the same breaker (State and
	// Snapshot are fine) and should be quick.
	OnStateChange func(name string, from, to State)
}

// bucket is one slice of the rolling window: which slice of time it holds
// and its failures. Its requests are counted per processor in stripes (see
// Breaker.reqs); every request writes one, and a line written by every
// core would move between the cores on each request.
type bucket struct {
	epoch    atomic.Int64 // which bucket-width slice of time these counts belong to
	failures atomic.Int64
}

// stripe is one processor's request counts, a counter per bucket, padded
// so that two stripes never share a cache line.
type stripe struct {
	requests [numBuckets]atomic.Int64
	_        [64 - numBuckets*8%64]byte
}

// Breaker is a circuit breaker for one target. A nil or disabled Breaker
// admits everything.
type Breaker struct {
	// Read on every call; written only on transitions.
	state     atomic.Uint64
	enabled   bool
	realClock bool
	name      string
	clk       clock.Clock
	origin    time.Time
	width     int64 // bucket width in ns
	coarse    bool  // use cur instead of reading the clock per event (real clock only)
	timer     clock.Timer
	minReq    int64
	ratio     float64
	baseOpen  time.Duration
	maxOpen   time.Duration
	onChange  func(name string, from, to State)
	_         [64]byte

	buckets [numBuckets]bucket
	reqs    []stripe // per processor (percpu); summed by sum

	// lastFail is the newest epoch that saw a failure. A success only needs
	// to re-evaluate the trip condition when a failure is still in the
	// window, so the all-success path skips summing the buckets.
	lastFail  atomic.Int64
	cur       atomic.Int64 // cached current epoch in coarse mode; -1 when it must be re-read
	openUntil atomic.Int64 // ns since origin; valid while open
	probeAt   atomic.Int64 // ns since origin the current probe was admitted
	// probeLease is how long a probe may be out before it is presumed lost
	// (ns; 0: until it reports). See SetProbeLease.
	probeLease atomic.Int64

	mu      sync.Mutex    // serialises transitions
	rotMu   sync.Mutex    // serialises bucket rotation (taken inside mu when clearing)
	openFor time.Duration // current open period; guarded by mu

	// testHookPreProbe runs between deciding to take the probe and locking,
	// so tests can widen that race window; nil outside tests.
	testHookPreProbe func()
}

// Ticket is the admission handed out by Allow. It is a small value, so
// returning it allocates nothing. The zero Ticket's Done is a no-op.
type Ticket struct {
	b    *Breaker
	word uint64
}

// New returns a breaker for the target name. clk supplies all time; nil
// means the real clock. At most one Options value is used.
func New(name string, cfg policy.CircuitBreaker, clk clock.Clock, opts ...Options) *Breaker {
	if clk == nil {
		clk = clock.Real{}
	}
	b := &Breaker{
		enabled:  cfg.Enabled,
		name:     name,
		clk:      clk,
		origin:   clk.Now(),
		minReq:   int64(cfg.MinimumRequests),
		ratio:    cfg.FailureRatio,
		baseOpen: cfg.Open,
		maxOpen:  cfg.MaxOpen,
	}
	// time.Now costs two clock reads on Linux; time.Since on a monotonic
	// origin costs one and is immune to wall-clock steps. That halves the
	// price of the reads left on the open and bucket-refresh paths.
	switch clk.(type) {
	case clock.Real, *clock.Real:
		b.realClock = true
	}
	if len(opts) > 0 {
		b.onChange = opts[0].OnStateChange
	}
	window := cfg.Window
	if window <= 0 {
		window = defaultWindow
	}
	b.width = max(int64(window)/numBuckets, 1)
	// Fewer than one request can never show a failure, so "at least 1" is
	// what a minimum of 0 means.
	if b.minReq < 1 {
		b.minReq = 1
	}
	if b.baseOpen <= 0 {
		b.baseOpen = defaultOpen
	}
	if b.maxOpen < b.baseOpen {
		b.maxOpen = b.baseOpen
	}
	b.openFor = b.baseOpen
	b.reqs = make([]stripe, percpu.Stripes())
	b.clearLocked()
	b.cur.Store(-1)
	if b.realClock && b.enabled {
		b.coarse = true
		// Created stopped so the field never changes after New; only
		// refreshEpoch's CAS winner resets it.
		b.timer = clk.AfterFunc(time.Hour, func() { b.cur.Store(-1) })
		b.timer.Stop()
	}
	return b
}

// Name returns the target name the breaker was created for.
func (b *Breaker) Name() string {
	if b == nil {
		return ""
	}
	return b.name
}

// Enabled reports whether the breaker can ever refuse.
func (b *Breaker) Enabled() bool { return b != nil && b.enabled }

// now returns nanoseconds since the breaker was created.
func (b *Breaker) now() int64 {
	var d time.Duration
	if b.realClock {
		d = time.Since(b.origin)
	} else {
		d = b.clk.Now().Sub(b.origin)
	}
	return max(int64(d), 0)
}

// currentEpoch returns the bucket slice of the present moment.
func (b *Breaker) currentEpoch() int64 {
	if b.coarse {
		if e := b.cur.Load(); e >= 0 {
			return e
		}
		return b.refreshEpoch()
	}
	return b.now() / b.width
}

// refreshEpoch reads the clock after the cached slice expired. Exactly one
// caller (the CAS winner) arms the timer, so it is never armed twice.
func (b *Breaker) refreshEpoch() int64 {
	now := b.now()
	e := now / b.width
	if b.cur.CompareAndSwap(-1, e) {
		b.timer.Reset(time.Duration(max((e+1)*b.width-now, 1)))
	}
	return e
}

// Allow asks to send one request. When ok is false the request must fail
// fast and retryAfter says how long until the breaker may admit again
// (see control.RetryAfterSeconds). When ok is true the caller must call Done on the
// ticket exactly once, with Neutral if the outcome is unknown.
func (b *Breaker) Allow() (t Ticket, retryAfter time.Duration, ok bool) {
	if b == nil || !b.enabled {
		return Ticket{}, 0, true
	}
	if w := b.state.Load(); w&phMask == phClosed {
		return Ticket{b: b, word: w}, 0, true
	}
	return b.allowSlow()
}

func (b *Breaker) allowSlow() (Ticket, time.Duration, bool) {
	for {
		w := b.state.Load()
		if w&phMask == phClosed {
			return Ticket{b: b, word: w}, 0, true
		}
		retryAfter, refused, now := b.refusal(w)
		if refused {
			return Ticket{}, retryAfter, false
		}
		if b.testHookPreProbe != nil {
			b.testHookPreProbe()
		}
		b.mu.Lock()
		if b.state.Load() == w {
			// probeAt must be visible before the state word that makes
			// other callers look at it, or they could see a stale lease
			// and admit a second probe.
			b.probeAt.Store(now)
			nw := b.transitionLocked(w, phProbing)
			b.mu.Unlock()
			return Ticket{b: b, word: nw}, 0, true
		}
		b.mu.Unlock()
		// Someone else moved the state; decide again on the new one.
	}
}

// refusal decides whether a caller fails fast on state word w (not
// closed), and for how long; now is the clock as read on the way.
func (b *Breaker) refusal(w uint64) (retryAfter time.Duration, refused bool, now int64) {
	now = b.now()
	switch w & phMask {
	case phOpen:
		if until := b.openUntil.Load(); now < until {
			return time.Duration(until - now), true, now
		}
	case phProbing:
		// The probe is out: everyone else fails fast until it reports,
		// or, past its lease, it is presumed lost (a ticket never
		// completed would otherwise hold the breaker half-open forever)
		// and its late result is ignored as stale.
		lease := b.probeLease.Load()
		if lease == 0 || now-b.probeAt.Load() < lease {
			return halfOpenRetryAfter, true, now
		}
	}
	return 0, false, now
}

// Refuses reports whether Allow would refuse now, without taking the
// half-open probe that Allow would hand out: for a caller that decides
// before it can send (a request that waits for 100 Continue before its
// body), which fails fast on an open breaker and leaves the probe to the
// request when it comes.
func (b *Breaker) Refuses() (retryAfter time.Duration, refused bool) {
	if b == nil || !b.enabled {
		return 0, false
	}
	w := b.state.Load()
	if w&phMask == phClosed {
		return 0, false
	}
	retryAfter, refused, _ = b.refusal(w)
	return retryAfter, refused
}

// SetProbeLease bounds how long a half-open probe may be out before the
// breaker presumes it lost and admits another: the longest a request
// through the breaker can legitimately take (its targets' timeout), so a
// slow probe is never mistaken for a lost one. 0 means no bound: the
// breaker waits for the probe's result however long it takes.
func (b *Breaker) SetProbeLease(d time.Duration) {
	if b != nil {
		b.probeLease.Store(int64(max(d, 0)))
	}
}

// Probe reports whether the ticket is the half-open probe: while it is out
// every other caller fails fast, so its holder must not sit in a queue.
func (t Ticket) Probe() bool { return t.b != nil && t.word&phMask != phClosed }

// Done reports the outcome of the request the ticket admitted. Results of
// tickets issued before the latest state change are ignored.
func (t Ticket) Done(o Outcome) {
	b := t.b
	if b == nil {
		return
	}
	if t.word&phMask != phClosed {
		b.probeDone(t.word, o)
		return
	}
	if o == Neutral || b.state.Load() != t.word {
		return
	}
	b.record(t.word, o)
}

// record counts a closed-state result and trips the breaker if needed.
func (b *Breaker) record(word uint64, o Outcome) {
	e := b.currentEpoch()
	i := e % numBuckets
	bk := &b.buckets[i]
	if bk.epoch.Load() != e && !b.rotate(i, e) {
		return
	}
	b.reqs[percpu.Index(len(b.reqs))].requests[i].Add(1)
	if o == Failure {
		bk.failures.Add(1)
		if b.lastFail.Load() < e {
			b.lastFail.Store(e)
		}
	} else if e-b.lastFail.Load() >= numBuckets {
		return
	}
	b.evaluate(word, e)
}

// rotate claims bucket i for epoch e, dropping the counts of the older
// slice it held. It reports false when the bucket already holds a newer
// slice, meaning the caller's event is older than the whole window and no
// longer counts.
func (b *Breaker) rotate(i, e int64) bool {
	bk := &b.buckets[i]
	b.rotMu.Lock()
	cur := bk.epoch.Load()
	if cur < e {
		// Counts first, epoch last: a writer that sees the new epoch must
		// also see the zeroed counts, or its increment could be wiped.
		for s := range b.reqs {
			b.reqs[s].requests[i].Store(0)
		}
		bk.failures.Store(0)
		bk.epoch.Store(e)
	}
	b.rotMu.Unlock()
	return cur <= e
}

// sum totals the buckets that fall inside the window ending at epoch e.
func (b *Breaker) sum(e int64) (requests, failures int64) {
	for i := range b.buckets {
		bk := &b.buckets[i]
		if be := bk.epoch.Load(); be > e-numBuckets && be <= e {
			for s := range b.reqs {
				requests += b.reqs[s].requests[i].Load()
			}
			failures += bk.failures.Load()
		}
	}
	return requests, failures
}

func (b *Breaker) evaluate(word uint64, e int64) {
	req, fail := b.sum(e)
	if fail == 0 || req < b.minReq || float64(fail)/float64(req) < b.ratio {
		return
	}
	b.mu.Lock()
	if b.state.Load() == word {
		b.openFor = b.baseOpen
		b.openUntil.Store(b.now() + int64(b.openFor))
		b.transitionLocked(word, phOpen)
	}
	b.mu.Unlock()
}

func (b *Breaker) probeDone(word uint64, o Outcome) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state.Load() != word {
		return
	}
	switch o {
	case Success:
		b.rotMu.Lock()
		b.clearLocked()
		b.rotMu.Unlock()
		b.openFor = b.baseOpen
		b.transitionLocked(word, phClosed)
	case Failure:
		if b.openFor > b.maxOpen/2 {
			b.openFor = b.maxOpen
		} else {
			b.openFor *= 2
		}
		b.openUntil.Store(b.now() + int64(b.openFor))
		b.transitionLocked(word, phOpen)
	default:
		b.transitionLocked(word, phIdle)
	}
}

// clearLocked forgets the rolling window. Caller holds rotMu (or owns b).
func (b *Breaker) clearLocked() {
	for i := range b.buckets {
		bk := &b.buckets[i]
		bk.epoch.Store(math.MinInt64)
		bk.failures.Store(0)
	}
	for s := range b.reqs {
		for i := range b.reqs[s].requests {
			b.reqs[s].requests[i].Store(0)
		}
	}
	b.lastFail.Store(math.MinInt64 / 2)
}

// transitionLocked publishes phase ph with a new generation. Caller holds
// mu and has already stored whatever the new phase's readers depend on.
func (b *Breaker) transitionLocked(from, ph uint64) uint64 {
	to := (from&^phMask + genUnit) | ph
	b.state.Store(to)
	if b.onChange != nil {
		if f, t := publicState(from), publicState(to); f != t {
			b.onChange(b.name, f, t)
		}
	}
	return to
}

// Reset closes the breaker and forgets its window, as an operator would
// after fixing the target. In-flight tickets become stale.
func (b *Breaker) Reset() {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.rotMu.Lock()
	b.clearLocked()
	b.rotMu.Unlock()
	b.openFor = b.baseOpen
	b.transitionLocked(b.state.Load(), phClosed)
}

// State returns the current state, with open-to-half-open applied as it
// would be by the next Allow (the stored state changes only lazily).
func (b *Breaker) State() State {
	if b == nil || !b.enabled {
		return Closed
	}
	w := b.state.Load()
	if w&phMask == phOpen && b.now() >= b.openUntil.Load() {
		return HalfOpen
	}
	return publicState(w)
}

// Snapshot is the breaker's state as the admin API reports it
// (GET /v1/breakers).
type Snapshot struct {
	Target string `json:"target"`
	// State is closed, half_open or open.
	State string `json:"state"`
	// Requests and Failures are the counts in the rolling window.
	Requests     int64   `json:"requests"`
	Failures     int64   `json:"failures"`
	FailureRatio float64 `json:"failure_ratio"`
	// OpenForSeconds is how much longer the breaker stays open before it
	// half-opens; 0 unless open.
	OpenForSeconds float64 `json:"open_for_seconds"`
}

// Snapshot reads the breaker without locking it.
func (b *Breaker) Snapshot() Snapshot {
	if b == nil {
		return Snapshot{State: Closed.String()}
	}
	s := Snapshot{Target: b.name, State: Closed.String()}
	if !b.enabled {
		return s
	}
	w := b.state.Load()
	now := b.now()
	st := publicState(w)
	if st == Open {
		if left := b.openUntil.Load() - now; left > 0 {
			s.OpenForSeconds = time.Duration(left).Seconds()
		} else {
			st = HalfOpen
		}
	}
	s.State = st.String()
	s.Requests, s.Failures = b.sum(now / b.width)
	if s.Requests > 0 {
		s.FailureRatio = float64(s.Failures) / float64(s.Requests)
	}
	return s
}
