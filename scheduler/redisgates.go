package scheduler

import (
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/pool"
	"github.com/warden-dev/warden/governor/window"
)

// Lanes and semaphores shared through Redis (backend.kind: redis, with a
// run store of this sidecar's own: bbolt or memory). The lanes are one
// lease set and each named semaphore another (window.LeaseSet keys under
// the backend's prefix), so every sidecar on the same Redis and prefix
// counts against the same limits. worker_max_concurrent and
// key_concurrency stay this sidecar's own. A postgres store checks lanes
// and semaphores in its claim transaction instead (shared.go), and this
// file is not used.
//
// An admission is one op of lease gates — the lane, then one per
// semaphore, then the definition's pool (its concurrency lease and rate
// window) — taken all or none in one round trip (pool.TryAcquireWith,
// window.Redis.TakeLeasedWith). No round trip is made under Scheduler.mu:
// one pass at a time picks the best waiting run under the lock with the
// local gates checked (exactly as admitLocked orders them), takes it out
// of the queue with its local lane, key slot and permits reserved,
// unlocks, asks Redis, and locks again to commit the admission or to put
// the run back where it was, noting the control that refused it.
//
// Leases live as long as the admission: Client.Hold renews them while the
// run is admitted; releaseLocked hands them to the next pass, which
// releases them outside the lock before it admits anything (with the
// client's one batch sender, that admission sees the slot free). A
// permit's local lease (heartbeats, the sweeper) still decides when the
// permit ends: the sweep that frees it locally releases it in Redis too.
// A killed sidecar renews nothing, so its leases expire after the client's
// LeaseTTL.
//
// A submission waits for the pass that decides its run (awaitRedisLocked),
// so that its receipt reports RUNNING or the gate that refused it, not a
// guess made before Redis was asked.
//
// Nobody announces a slot freed on another sidecar: while a run waits on a
// shared gate, a pass runs every RedisRetryEvery on the injected clock,
// and at once when this sidecar frees a lane or permit.
//
// Outage: with on_error fail_open, when Redis cannot decide, the local
// reservations made at the pick decide (this sidecar's own lanes and
// permits, the current in-process rules); the runs so admitted have their
// leases added in Redis, whatever the limits, once it answers again, so
// that the fleet counts them. With fail_closed the run goes back to the
// queue with control upstream until Redis answers.

// RedisRetryEvery is how often runs refused by a shared gate are retried:
// the longest a lane or permit freed on another sidecar stays unused.
const RedisRetryEvery = pool.SharedRetryEvery

// Lease set names of the shared gates.
const (
	laneKind, laneName = "lanes", "scheduler"
	semKind            = "semaphore"
)

// redisGates is a scheduler's state for its Redis gates.
type redisGates struct {
	red *window.Redis

	passes sync.WaitGroup

	// Guarded by Scheduler.mu.
	stopped   bool
	passing   bool // a pass is running
	again     bool // something changed while it ran: pass again
	admit     bool // a pass is to admit, not only release
	tick      clock.Timer
	tickArmed bool
	// notes is the control of each definition's last refusal by one of
	// its own shared gates (semaphore, pool); global is the last refusal
	// that holds every definition (lanes, upstream). They are what a
	// waiting run's control reports: a view never asks Redis.
	notes     map[string]string
	poolNotes map[string]string // by pool ID
	global    string
	// free is how many lanes the last answer left free: how many
	// admissions the next round asks at once (see redisAdmit).
	free     int
	releases []window.Held
	// adopt lists admissions that hold no lease in Redis although they
	// run: admitted while Redis could not decide (fail_open), or running
	// when this sidecar started (recovered RUNNING runs).
	adopt map[*active]struct{}
	// iters counts the admitting iterations of passes started so far;
	// verdicts are the submissions waiting for one to decide their run,
	// by run.
	iters    uint64
	verdicts map[uint64]*verdict
}

// verdict is what the passes decided for a run being submitted, so that
// its receipt reports it: admitted (RUNNING), refused by a shared gate
// (that control), or left waiting without being tried (the control its
// local gates or the last refusals name). Guarded by Scheduler.mu.
type verdict struct {
	iter     uint64        // rg.iters when the submission asked
	done     chan struct{} // closed once decided
	admitted bool
	control  string // the shared gate that refused it, if one did
}

// redisHeld is what an admission holds in Redis; guarded by Scheduler.mu.
type redisHeld struct {
	lane    window.Held
	permits []heldPermit
	adopt   bool // nothing held yet: in redisGates.adopt
}

type heldPermit struct {
	name string
	h    window.Held
}

// newRedisGates returns the Redis gates for counter, or nil when lanes and
// semaphores stay in process: no shared counter, or a shared store (it
// checks them in its own claims).
func newRedisGates(counter window.Counter, sharedStore bool) *redisGates {
	red, ok := counter.(*window.Redis)
	if !ok || sharedStore {
		return nil
	}
	return &redisGates{red: red, notes: map[string]string{}, poolNotes: map[string]string{}, adopt: map[*active]struct{}{},
		verdicts: map[uint64]*verdict{}}
}

// awaitRedisLocked asks for a pass that admits run seq, just queued by a
// submission, and returns the verdict it will decide; nil when no pass
// will (no Redis gates, or admission has stopped). Submit waits for it
// instead of answering before Redis was asked: a run the shared gates
// admit at once is answered RUNNING, as without Redis, and one they refuse
// names the gate that did, not the lanes by default (SPEC §4).
func (s *Scheduler) awaitRedisLocked(seq uint64) *verdict {
	rg := s.rg
	if rg == nil || rg.stopped || s.draining || s.closed {
		return nil
	}
	v := &verdict{iter: rg.iters, done: make(chan struct{})}
	rg.verdicts[seq] = v
	s.pokeRedisLocked(true)
	return v
}

// decideLocked closes the verdict of run seq, if a submission waits for
// one.
func (rg *redisGates) decideLocked(seq uint64, admitted bool, control string) {
	if v := rg.verdicts[seq]; v != nil {
		delete(rg.verdicts, seq)
		v.admitted, v.control = admitted, control
		close(v.done)
	}
}

// decideUntriedLocked closes the verdicts asked before admitting iteration
// iter began: that iteration went on until nothing more could start, so a
// run it did not admit waits, for the control its views name.
func (rg *redisGates) decideUntriedLocked(iter uint64) {
	for seq, v := range rg.verdicts {
		if v.iter < iter {
			rg.decideLocked(seq, false, "")
		}
	}
}

// pokeRedisLocked asks for a pass that releases what ended and, with
// admit, admits what can start; it never blocks.
func (s *Scheduler) pokeRedisLocked(admit bool) {
	rg := s.rg
	if rg.stopped {
		return
	}
	if admit {
		rg.admit = true
	}
	if rg.passing {
		rg.again = true
		return
	}
	rg.passing = true
	rg.passes.Add(1)
	go s.redisPass(rg)
}

// armRedisTickLocked retries the shared gates after RedisRetryEvery.
func (s *Scheduler) armRedisTickLocked(rg *redisGates) {
	if rg.tickArmed || rg.stopped {
		return
	}
	rg.tickArmed = true
	rg.tick = s.clk.AfterFunc(RedisRetryEvery, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.rg != rg {
			return // a scheduler restart replaced these gates
		}
		rg.tickArmed = false
		s.pokeRedisLocked(true)
	})
}

// redisPass releases what ended, gives leases to the admissions that run
// without them, and admits waiting runs; again while something changed
// meanwhile.
func (s *Scheduler) redisPass(rg *redisGates) {
	defer rg.passes.Done()
	s.mu.Lock()
	for {
		rg.again = false
		admit := rg.admit
		rg.admit = false
		var iter uint64
		if admit {
			rg.iters++
			iter = rg.iters
		}
		releases := rg.releases
		rg.releases = nil
		adopt := s.adoptionsLocked(rg)
		s.mu.Unlock()
		for _, h := range releases {
			h.Release(nil)
		}
		s.adoptLeases(rg, adopt)
		retry := false
		if admit {
			retry = s.redisAdmit(rg)
		}
		s.mu.Lock()
		if admit {
			rg.decideUntriedLocked(iter)
		}
		// Admissions still without leases get them at a tick once Redis
		// answers (nothing else announces its return).
		if retry || len(rg.adopt) > 0 && rg.red.Client() != nil {
			s.armRedisTickLocked(rg)
		}
		if !rg.again || rg.stopped {
			rg.passing = false
			s.mu.Unlock()
			return
		}
	}
}

// claim is one run picked for admission through the shared gates.
type claim struct {
	a     *active
	wants []window.LeaseWant // the lane, then a.sems in order

	// The outcome, set unlocked by takeGates.
	ok      bool
	control string            // the pool's refusal, or upstream
	got     []window.LeaseGot // the lease gates' outcome when Redis decided them
	lease   pool.Lease        // the pool's admission
}

// maxInFlight bounds the admissions one pass asks Redis at once.
const maxInFlight = 16

// redisAdmit admits waiting runs, each one round trip with Scheduler.mu
// released, until nothing more can start. It reports whether a run was
// refused by a gate whose freeing nobody announces (retry on the tick).
//
// Several admissions travel together — the client's batcher sends them in
// one script call — as many as the lanes had free at the last answer
// (rg.free; at most maxInFlight). While lanes are plenty, their order does
// not matter: all of them start. When lanes are scarce, rg.free is 1 and
// admissions go one at a time, best first, so a sidecar's own priority
// order holds where it decides who starts.
func (s *Scheduler) redisAdmit(rg *redisGates) (retry bool) {
	s.mu.Lock()
	s.pass++
	for {
		var claims []*claim
		for len(claims) < max(rg.free, 1) {
			c := s.pickLocked(rg)
			if c == nil {
				break
			}
			claims = append(claims, c)
		}
		if len(claims) == 0 {
			s.mu.Unlock()
			return retry
		}
		s.mu.Unlock()
		if len(claims) == 1 {
			s.takeGates(rg, claims[0])
		} else {
			var wg sync.WaitGroup
			for _, c := range claims {
				wg.Add(1)
				go func() {
					defer wg.Done()
					s.takeGates(rg, c)
				}()
			}
			wg.Wait()
		}
		now := s.clk.Now()
		type refusal struct {
			c       *claim
			control string // "" when a drain began
		}
		var started []*active
		var refused []refusal
		stop := false
		free := maxInFlight
		s.mu.Lock()
		cfg := s.cfgPtr.Load()
		for _, c := range claims {
			admitted, control, halt := s.settleLocked(rg, c, now)
			stop = stop || halt
			if admitted {
				started = append(started, c.a)
			} else {
				refused = append(refused, refusal{c, control})
			}
			free = min(free, lanesFree(cfg, c, admitted))
		}
		rg.free = free
		s.mu.Unlock()
		for _, r := range refused {
			giveBack(r.c)
			switch r.control {
			case "":
				// Put back because a drain began.
			case ControlPoolRate:
				r.c.a.def.pool.WatchWindow() // woken at the window's boundary
			case ControlPoolQueue:
				// Others wait in the pool ahead of it: its OnFree wakes the pass.
			default:
				retry = true
			}
		}
		s.launch(started)
		s.mu.Lock()
		if stop {
			s.mu.Unlock()
			return retry
		}
	}
}

// lanesFree is how many lanes c's answer says are free after it: what the
// next round may ask for at once. Unknown (no answer from Redis, no
// config) counts as one; a refusal as none.
func lanesFree(cfg *config, c *claim, admitted bool) int {
	switch {
	case !admitted:
		return 0
	case len(c.got) == 0 || cfg == nil:
		return 1
	}
	return max(int(int64(cfg.lanes)-c.got[0].Holders), 0)
}

// pickLocked takes the best waiting run that this sidecar's own gates
// admit out of the queue, its local lane, key slot and permits reserved;
// nil when there is none. The choice is admitLocked's: the best head
// (priority, then age) among definitions not blocked in this pass.
func (s *Scheduler) pickLocked(rg *redisGates) *claim {
	cfg := s.cfgPtr.Load()
	if cfg == nil || s.draining || s.closed {
		return nil
	}
	limit, _ := cfg.limit()
	for s.running < limit {
		best, top := s.bestHeadLocked(cfg)
		if best == nil {
			return nil
		}
		if !s.semaphoresFree(best) {
			best.skip = s.pass
			continue
		}
		dq := s.q.defs[best.name]
		e := s.q.admit(dq)
		a := &active{seq: e.seq, def: best, q: dq, key: e.g.key, prio: top.prio, queuedAt: e.queuedAt}
		a.sems = s.acquireSemaphores(best, a)
		s.running++
		s.deliveries.Add(1)
		prefix := rg.red.Prefix()
		c := &claim{a: a, wants: make([]window.LeaseWant, 0, 1+len(a.sems))}
		c.wants = append(c.wants, window.LeaseWant{Set: window.LeaseSet(prefix, laneKind, laneName), Limit: int64(cfg.lanes)})
		for _, name := range a.sems {
			c.wants = append(c.wants, window.LeaseWant{Set: window.LeaseSet(prefix, semKind, name), Limit: int64(cfg.semaphores[name])})
		}
		return c
	}
	return nil
}

// takeGates asks Redis for c's gates, without Scheduler.mu: the lane and
// permits in the op of the definition's pool when the pool is shared, else
// alone.
func (s *Scheduler) takeGates(rg *redisGates, c *claim) {
	now := s.clk.Now()
	p := c.a.def.pool
	if p != nil && p.Shared() {
		l, by, ok, got := p.TryAcquireWith(c.wants, now)
		c.lease, c.control, c.ok, c.got = l, string(by), ok, got
		return
	}
	res, err := rg.red.TakeLeasedWith(c.wants, nil, nil, 0, 0, "", 0, now)
	switch {
	case err != nil && rg.red.FailClosed():
		c.control = ControlUpstream
		return
	case err != nil:
		c.ok = true // fail_open: the local reservations made at the pick decide
	default:
		c.ok, c.got = res.Admitted, res.Extra
	}
	if !c.ok || p == nil {
		return
	}
	// A pool on another counter than the scheduler's (not the case with
	// the app's wiring, where both are the backend's): its gates are in
	// process and cost no round trip.
	l, control, ok := p.TryAcquire(now)
	if !ok {
		// The lane and permits taken are given back with the refusal.
		c.ok, c.control = false, string(control)
		return
	}
	c.lease = l
}

// settleLocked commits c's admission or puts the run back in the queue.
// It reports the refusing control ("" when a drain began meanwhile), and
// whether the pass should stop. Whatever a run put back took is for
// giveBack, outside the lock.
func (s *Scheduler) settleLocked(rg *redisGates, c *claim, now time.Time) (admitted bool, control string, stop bool) {
	a, d := c.a, c.a.def
	if s.draining || s.closed {
		s.unpickLocked(a)
		return false, "", true
	}
	if c.ok {
		a.admittedAt = now.UnixNano()
		a.lease = c.lease
		a.red = &redisHeld{}
		if len(c.got) > 0 {
			a.red.lane = c.got[0].Lease
			for i, name := range a.sems {
				a.red.permits = append(a.red.permits, heldPermit{name, c.got[1+i].Lease})
			}
		} else {
			// Redis could not decide (fail_open): count the run there
			// once it can.
			a.red.adopt = true
			rg.adopt[a] = struct{}{}
		}
		s.active[a.seq] = a
		delete(rg.notes, d.name)
		if d.pool != nil {
			delete(rg.poolNotes, d.pool.ID())
		}
		rg.global = ""
		if d.waitObs != nil {
			d.waitObs.Observe(time.Duration(a.admittedAt - a.queuedAt).Seconds())
		}
		rg.decideLocked(a.seq, true, "")
		return true, "", false
	}
	s.unpickLocked(a)
	control = refusal(c)
	rg.decideLocked(a.seq, false, control)
	switch control {
	case ControlLanes, ControlUpstream:
		// Nothing else can start now: every definition needs a lane.
		rg.global, stop = control, true
		delete(rg.notes, d.name)
	default:
		rg.notes[d.name] = control
		if d.pool != nil && strings.HasPrefix(control, "pool_") {
			rg.poolNotes[d.pool.ID()] = control
		}
		d.skip = s.pass
	}
	return false, control, stop
}

// refusal names the control that refused c, in controlLocked's order: the
// run's semaphores, its pool, then the lanes.
func refusal(c *claim) string {
	if c.control == ControlUpstream {
		return c.control
	}
	for i := 1; i < len(c.got); i++ {
		if !c.got[i].OK {
			return ControlSemaphore
		}
	}
	if c.control != "" {
		return c.control
	}
	return ControlLanes
}

// unpickLocked undoes pickLocked's reservations and puts the run back in
// its place: same priority and age, and for schedule_to_start its place
// in the definition's deadline order.
func (s *Scheduler) unpickLocked(a *active) {
	s.running--
	s.q.finished(a.q, a.key)
	s.releaseSemaphores(a.sems, a)
	h := s.q.push(a.q, a.key, a.seq, a.prio, a.queuedAt)
	if a.q.fifoOn {
		s.q.placeFIFO(a.q, h)
	}
	if cfg := s.cfgPtr.Load(); cfg != nil {
		if d := cfg.defs[a.q.name]; d != nil {
			s.armSTSLocked(d)
		}
	}
	s.deliveries.Done()
}

// giveBack returns what a claim took when it was not committed (leases
// not taken are zero and inert).
func giveBack(c *claim) {
	for _, g := range c.got {
		g.Lease.Release(nil)
	}
	c.lease.Release()
	c.lease.Refund()
}

// placeFIFO moves the entry of h, just pushed at the end of d's FIFO, to
// its place in queue-entry order, so that schedule_to_start sees a run put
// back after a refused claim as the old run it is. The slot it takes is
// the nearest stale one before that place (usually the run's own previous
// entry), so the move costs the distance from the FIFO's head, not its
// length.
func (q *queue) placeFIFO(d *defQueue, h handle) {
	last := len(d.fifo) - 1
	me := d.fifo[last]
	key := q.slab[h]
	after := func(f fifoEntry) bool {
		e := &q.slab[f.h]
		return e.queuedAt > key.queuedAt || e.queuedAt == key.queuedAt && e.seq > key.seq
	}
	p, free := last, -1
	for i := d.fifoHead; i < last; i++ {
		f := d.fifo[i]
		if f == me {
			// The run got its slot back, so its previous entry, counted
			// stale when it left, is live again and in place.
			d.fifo = d.fifo[:last]
			d.fifoStale--
			return
		}
		if !q.live(f) {
			free = i
			continue
		}
		if after(f) {
			p = i
			break
		}
	}
	if p == last {
		return // it is the newest: already in place
	}
	switch {
	case free >= 0:
		// Shift [free+1, p) down over the stale slot.
		copy(d.fifo[free:p-1], d.fifo[free+1:p])
		d.fifo[p-1] = me
		d.fifo = d.fifo[:last]
		d.fifoStale--
	case d.fifoHead > 0:
		d.fifoHead--
		copy(d.fifo[d.fifoHead:p-1], d.fifo[d.fifoHead+1:p])
		d.fifo[p-1] = me
		d.fifo = d.fifo[:last]
	default:
		copy(d.fifo[p+1:], d.fifo[p:last])
		d.fifo[p] = me
	}
}

// dropRedisLocked hands an ended admission's leases to the next pass,
// which releases them outside the lock.
func (s *Scheduler) dropRedisLocked(a *active) {
	rg, held := s.rg, a.red
	a.red = nil
	if held.adopt {
		delete(rg.adopt, a)
		return
	}
	rg.releases = held.appendLeases(rg.releases)
	// Release only: whoever released decides whether to admit now (a
	// failing store must not make admissions spin, see admissionFailed).
	s.pokeRedisLocked(false)
}

// dropRedisPermitLocked releases a's permit of semaphore name in Redis:
// its local lease expired (the sweeper), so the permit is free for every
// sidecar while the run itself may go on.
func (s *Scheduler) dropRedisPermitLocked(a *active, name string) {
	held := a.red
	for i, p := range held.permits {
		if p.name == name {
			s.rg.releases = append(s.rg.releases, p.h)
			held.permits = slices.Delete(held.permits, i, i+1)
			s.pokeRedisLocked(false)
			return
		}
	}
}

// adoptLocked records that a runs without leases in Redis (a RUNNING run
// recovered at start): the next pass adds them.
func (s *Scheduler) adoptLocked(a *active) {
	a.red = &redisHeld{adopt: true}
	s.rg.adopt[a] = struct{}{}
	s.pokeRedisLocked(false)
}

// adoption is one admission getting its leases after the fact.
type adoption struct {
	a     *active
	names []string
	wants []window.LeaseWant
}

// adoptionsLocked lists the admissions to give leases to, when Redis can
// take them now.
func (s *Scheduler) adoptionsLocked(rg *redisGates) []adoption {
	if len(rg.adopt) == 0 {
		return nil
	}
	if cli := rg.red.Client(); cli == nil || cli.Down() {
		return nil
	}
	prefix := rg.red.Prefix()
	out := make([]adoption, 0, len(rg.adopt))
	for a := range rg.adopt {
		// No limit: the run is running whatever the sets hold, and the
		// others must count it.
		ad := adoption{a: a, wants: []window.LeaseWant{{Set: window.LeaseSet(prefix, laneKind, laneName), Limit: math.MaxInt64}}}
		for _, name := range a.sems {
			if sem := s.sems[name]; sem != nil {
				if _, held := sem.holders[a]; held {
					ad.names = append(ad.names, name)
					ad.wants = append(ad.wants, window.LeaseWant{Set: window.LeaseSet(prefix, semKind, name), Limit: math.MaxInt64})
				}
			}
		}
		out = append(out, ad)
	}
	return out
}

// adoptLeases takes the leases of adopt in Redis, outside the lock; those
// it could not take stay in redisGates.adopt for a later pass.
func (s *Scheduler) adoptLeases(rg *redisGates, adopt []adoption) {
	for _, ad := range adopt {
		res, err := rg.red.TakeLeasedWith(ad.wants, nil, nil, 0, 0, "", 0, s.clk.Now())
		if err != nil || !res.Admitted {
			return // Redis failed again
		}
		s.mu.Lock()
		a := ad.a
		if a.red == nil || !a.red.adopt || s.rg != rg {
			// Ended while its leases were being taken.
			s.mu.Unlock()
			for _, g := range res.Extra {
				g.Lease.Release(nil)
			}
			continue
		}
		delete(rg.adopt, a)
		a.red.adopt = false
		a.red.lane = res.Extra[0].Lease
		var swept []window.Held
		for j, name := range ad.names {
			h := res.Extra[1+j].Lease
			if sem := s.sems[name]; sem != nil {
				if _, held := sem.holders[a]; held {
					a.red.permits = append(a.red.permits, heldPermit{name, h})
					continue
				}
			}
			// Its local lease expired meanwhile: the sweeper freed it.
			swept = append(swept, h)
		}
		s.mu.Unlock()
		for _, h := range swept {
			h.Release(nil)
		}
	}
}

// redisControlLocked names the control holding a waiting run of d whose
// own local gates (key, this sidecar's permits) have room, from what the
// last shared admissions found: no view asks Redis.
func (s *Scheduler) redisControlLocked(cfg *config, d *definition) string {
	rg := s.rg
	shared := false
	if cli := rg.red.Client(); cli != nil {
		if cli.Down() {
			if rg.red.FailClosed() {
				return ControlUpstream
			}
		} else {
			shared = true
		}
	}
	if shared {
		if c := rg.notes[d.name]; c != "" {
			return c
		}
		if rg.global != "" {
			return rg.global
		}
	}
	limit, control := cfg.limit()
	if s.running >= limit {
		return control
	}
	return ControlLanes
}

// redisSemaphores is GET /v1/semaphores with the permits held across
// every sidecar, read from Redis outside the lock; this sidecar's own
// count when Redis cannot say.
func (s *Scheduler) redisSemaphores(now time.Time) []SemaphoreState {
	s.mu.Lock()
	out := make([]SemaphoreState, 0, len(s.sems))
	for _, sem := range s.sems {
		out = append(out, SemaphoreState{Name: sem.name, Permits: sem.permits, Held: len(sem.holders)})
	}
	rg := s.rg
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b SemaphoreState) int { return strings.Compare(a.Name, b.Name) })
	if rg == nil {
		return out
	}
	cli := rg.red.Client()
	if cli == nil || cli.Down() {
		return out
	}
	prefix := rg.red.Prefix()
	for i := range out {
		if n, ok := rg.red.LeaseHolders(window.LeaseSet(prefix, semKind, out[i].Name), now); ok {
			out[i].Held = int(n)
		}
	}
	return out
}

// stopRedisGates stops the passes and the tick, then gives back the
// leases of the runs that are not running: nothing on this sidecar tracks
// its runs once the scheduler is stopped. The lane and permits of a run
// the worker owns (RUNNING) are abandoned instead: no longer renewed, they
// stay counted by every sidecar until the lease TTL ends, because the run
// goes on without this sidecar; a restart takes them again (for up to one
// TTL both count — the fleet admits less, never more, meanwhile).
func (s *Scheduler) stopRedisGates() {
	s.mu.Lock()
	rg := s.rg
	if rg == nil {
		s.mu.Unlock()
		return
	}
	rg.stopped = true
	if rg.tick != nil {
		rg.tick.Stop()
	}
	s.mu.Unlock()
	rg.passes.Wait()
	s.mu.Lock()
	releases := rg.releases
	rg.releases = nil
	var abandon []window.Held
	for _, a := range s.active {
		if held := a.red; held != nil && !held.adopt {
			if a.getPhase() == phaseAsync {
				abandon = held.appendLeases(abandon)
			} else {
				releases = held.appendLeases(releases)
			}
		}
		a.red = nil
	}
	clear(rg.adopt)
	// None should be left (stop waits for every API call, a Submit
	// included, before it stops the gates); never leave one waiting.
	for seq := range rg.verdicts {
		rg.decideLocked(seq, false, "")
	}
	s.mu.Unlock()
	for _, h := range abandon {
		h.Abandon()
	}
	for _, h := range releases {
		h.Release(nil)
	}
}

// appendLeases appends everything the admission holds in Redis to dst:
// its lane, then its permits (no slice of its own: it runs at every end
// of a run).
func (h *redisHeld) appendLeases(dst []window.Held) []window.Held {
	dst = append(dst, h.lane)
	for _, p := range h.permits {
		dst = append(dst, p.h)
	}
	return dst
}
