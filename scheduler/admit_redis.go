package scheduler

import (
	"context"
	"sync"
	"time"

	"github.com/warden-dev/warden/governor"
	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/pool"
	"github.com/warden-dev/warden/governor/window"
	"github.com/warden-dev/warden/scheduler/store"
)

// Lanes and semaphores shared through Redis (backend.kind: redis, with a
// run store of this sidecar's own: bbolt or memory). The lanes are one
// lease set and each named semaphore another (window.LeaseSet keys under
// the backend's prefix), so every sidecar on the same Redis and prefix
// counts against the same limits. worker_max_concurrent and
// key_concurrency stay this sidecar's own. A postgres store checks lanes
// and semaphores in its claim transaction instead (admit_postgres.go),
// and this admitter is not used.
//
// An admission is one op of lease gates — the lane, then one per
// semaphore, then the definition's pool (its concurrency lease and rate
// window) — taken all or none in one round trip (pool.TryAcquireWith,
// window.Redis.TakeLeasedWith). No round trip is made under Scheduler.mu:
// one pass at a time picks the best waiting run under the lock with the
// local gates checked (in the local admitter's order), takes it out of
// the queue with its local lane, key slot and permits reserved,
// unlocks, asks Redis, and locks again to commit the admission or to put
// the run back where it was, noting the control that refused it.
//
// Leases live as long as the admission: Client.Hold renews them while the
// run is admitted; releasedLocked hands them to the next pass, which
// releases them outside the lock before it admits anything (with the
// client's one batch sender, that admission sees the slot free). A
// permit's local lease (heartbeats, the sweeper) still decides when the
// permit ends: the sweep that frees it locally releases it in Redis too.
// A killed sidecar renews nothing, so its leases expire after the client's
// LeaseTTL.
//
// A submission waits for the pass that decides its run (awaitLocked),
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

// redisAdmitter admits runs with their lane and permits leased in Redis.
type redisAdmitter struct {
	s   *Scheduler
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
	// admissions the next round asks at once (see admitWaiting).
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
	iter     uint64        // redisAdmitter.iters when the submission asked
	done     chan struct{} // closed once decided
	admitted bool
	control  string // the shared gate that refused it, if one did
}

// redisHeld is what an admission holds in Redis; guarded by Scheduler.mu.
type redisHeld struct {
	lane    window.Held
	permits []heldPermit
	adopt   bool // nothing held yet: in redisAdmitter.adopt
}

type heldPermit struct {
	name string
	h    window.Held
}

func newRedisAdmitter(s *Scheduler, red *window.Redis) *redisAdmitter {
	return &redisAdmitter{s: s, red: red, notes: map[string]string{}, poolNotes: map[string]string{},
		adopt: map[*active]struct{}{}, verdicts: map[uint64]*verdict{}}
}

// admitLocked asks for a pass: admissions are taken outside the lock.
func (rg *redisAdmitter) admitLocked(*config, time.Time) []*active {
	rg.pokeLocked(true)
	return nil
}

// reserveLocked: a submission is never admitted before Redis is asked.
func (*redisAdmitter) reserveLocked(*config, *definition, string, int32, time.Time) *active {
	return nil
}

// claim: the passes run on their own goroutine.
func (*redisAdmitter) claim() {}

func (rg *redisAdmitter) enqueueLocked(r *store.Run) { rg.s.pushLocked(r) }

func (rg *redisAdmitter) leasePermits(a *active, until int64) { rg.s.leaseHeldPermits(a, until) }

func (*redisAdmitter) storeControl(context.Context, string, string, time.Time) (string, bool) {
	return "", false
}

func (*redisAdmitter) heldElsewhere(string, string) error { return nil }

// queues names a pool row's control from what the last shared admissions
// found: no round trip under the lock.
func (rg *redisAdmitter) queues(now time.Time) []QueueState {
	return rg.s.indexQueues(now, func(d *definition) string { return rg.poolNotes[d.pool.ID()] })
}

// start recovers the runs of this sidecar's own store; the RUNNING ones
// get their lane and permits in Redis by the next pass.
func (rg *redisAdmitter) start(ctx context.Context, c *governor.Controls) error {
	return rg.s.recover(ctx, c, rg.adoptLocked)
}

// awaitLocked asks for a pass that admits run seq, just queued by a
// submission, and returns the verdict it will decide; nil when no pass
// will (admission has stopped). Submit waits for it instead of answering
// before Redis was asked: a run the shared gates admit at once is answered
// RUNNING, as without Redis, and one they refuse names the gate that did,
// not the lanes by default (SPEC §4).
func (rg *redisAdmitter) awaitLocked(seq uint64) *verdict {
	s := rg.s
	if rg.stopped || s.draining || s.closed {
		return nil
	}
	v := &verdict{iter: rg.iters, done: make(chan struct{})}
	rg.verdicts[seq] = v
	rg.pokeLocked(true)
	return v
}

// decideLocked closes the verdict of run seq, if a submission waits for
// one.
func (rg *redisAdmitter) decideLocked(seq uint64, admitted bool, control string) {
	if v := rg.verdicts[seq]; v != nil {
		delete(rg.verdicts, seq)
		v.admitted, v.control = admitted, control
		close(v.done)
	}
}

// decideUntriedLocked closes the verdicts asked before admitting iteration
// iter began: that iteration went on until nothing more could start, so a
// run it did not admit waits, for the control its views name.
func (rg *redisAdmitter) decideUntriedLocked(iter uint64) {
	for seq, v := range rg.verdicts {
		if v.iter < iter {
			rg.decideLocked(seq, false, "")
		}
	}
}

// pokeLocked asks for a pass that releases what ended and, with
// admit, admits what can start; it never blocks.
func (rg *redisAdmitter) pokeLocked(admit bool) {
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
	go rg.pass()
}

// armTickLocked retries the shared gates after RedisRetryEvery.
func (rg *redisAdmitter) armTickLocked() {
	s := rg.s
	if rg.tickArmed || rg.stopped {
		return
	}
	rg.tickArmed = true
	rg.tick = s.clk.AfterFunc(RedisRetryEvery, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.adm != admitter(rg) {
			return // a scheduler restart replaced these gates
		}
		rg.tickArmed = false
		rg.pokeLocked(true)
	})
}

// pass releases what ended, gives leases to the admissions that run
// without them, and admits waiting runs; again while something changed
// meanwhile.
func (rg *redisAdmitter) pass() {
	s := rg.s
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
		adopt := rg.adoptionsLocked()
		s.mu.Unlock()
		for _, h := range releases {
			h.Release(nil)
		}
		rg.adoptLeases(adopt)
		retry := false
		if admit {
			retry = rg.admitWaiting()
		}
		s.mu.Lock()
		if admit {
			rg.decideUntriedLocked(iter)
		}
		// Admissions still without leases get them at a tick once Redis
		// answers (nothing else announces its return).
		if retry || len(rg.adopt) > 0 && rg.red.Client() != nil {
			rg.armTickLocked()
		}
		if !rg.again || rg.stopped {
			rg.passing = false
			s.mu.Unlock()
			return
		}
	}
}

// controlLocked names the control holding a waiting run of d whose
// own local gates (key, this sidecar's permits) have room, from what the
// last shared admissions found: no view asks Redis.
func (rg *redisAdmitter) controlLocked(cfg *config, d *definition, _ time.Time) string {
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
	return rg.s.limitControlLocked(cfg)
}

// semaphores is GET /v1/semaphores with the permits held across
// every sidecar, read from Redis outside the lock; this sidecar's own
// count when Redis cannot say.
func (rg *redisAdmitter) semaphores(now time.Time) []SemaphoreState {
	out := rg.s.heldSemaphores()
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
