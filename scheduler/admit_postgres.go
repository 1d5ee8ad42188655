package scheduler

import (
	"context"
	"fmt"
	"time"

	"github.com/warden-dev/warden/governor"
	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/window"
	"github.com/warden-dev/warden/scheduler/store"
	"github.com/warden-dev/warden/scheduler/store/pgstore"
)

// With a shared store (scheduler.store.kind: postgres) several sidecars
// serve one queue, so no sidecar can decide admissions from its own
// index. The scheduler then takes its admissions from the store instead:
// a claim transaction checks every shared gate (lanes across sidecars,
// key_concurrency, the definition's pool, semaphore permits) and returns
// the runs already STARTING, owned by this sidecar under a lease; the
// scheduler delivers them exactly as it delivers what the local admitter
// picks. Everything after admission (delivery, replies, timeouts,
// complete and heartbeat calls, retries) is the same code path.
//
// Claims happen on events: a NOTIFY from any sidecar (a submission, a run
// leaving STARTING/RUNNING, a sweep that changed something), this
// sidecar's own completions, a pool window's boundary — and a slow poll as
// a safety net. The same goroutine renews this sidecar's leases and
// sweeps expired ones (any sidecar may).

// DefaultLease is how long a claimed run stays with its sidecar without a
// renewal (Options.Lease): renewed every third of it, swept after it.
const DefaultLease = 15 * time.Second

// sharedPoll is the fallback claim interval while no NOTIFY arrives.
const sharedPoll = time.Second

// sharedCallTimeout bounds every store call of the shared loop.
const sharedCallTimeout = 5 * time.Second

// postgresAdmitter admits runs by claims from the shared store.
type postgresAdmitter struct {
	s      *Scheduler
	st     *pgstore.Store
	owner  string // kept across restarts in the data directory (sidecarid.go)
	unlock func() // releases the data directory's lock; nil when none was taken
	lease  time.Duration
	cancel context.CancelFunc
	done   chan struct{} // closed when the listener and the ticker have stopped

	// Guarded by Scheduler.mu.
	boundary   clock.Timer // wakes a claim at the end of a window that held runs
	boundaryAt int64
}

// newPostgresAdmitter names this sidecar in the shared store: Options.Owner,
// else the id kept in the data directory, which stays locked while the
// scheduler runs.
func newPostgresAdmitter(s *Scheduler, st *pgstore.Store) (*postgresAdmitter, error) {
	pg := &postgresAdmitter{s: s, st: st, owner: s.opts.Owner, lease: s.opts.Lease}
	switch {
	case pg.owner != "":
	case s.opts.DataDir != "":
		// The same id as before a restart: the runs this sidecar's
		// worker accepted are still its own (recover).
		var err error
		if pg.owner, pg.unlock, err = sidecarOwner(s.opts.DataDir); err != nil {
			return nil, err
		}
	default:
		pg.owner = newOwner()
	}
	if pg.lease <= 0 {
		pg.lease = DefaultLease
	}
	return pg, nil
}

// start takes back what this sidecar's previous process left in the
// shared store, then starts listening and the lease loop.
func (pg *postgresAdmitter) start(ctx context.Context, _ *governor.Controls) error {
	if err := pg.recover(ctx); err != nil {
		return err
	}
	pg.startLoops()
	pg.s.log.Info("run store shared through postgres", "owner", pg.owner, "schema", pg.st.Schema(), "lease", pg.lease)
	return nil
}

// startLoops starts the listener and the lease loop.
func (pg *postgresAdmitter) startLoops() {
	s := pg.s
	ctx, cancel := context.WithCancel(context.Background())
	pg.cancel, pg.done = cancel, make(chan struct{})
	listened := make(chan struct{})
	go func() {
		defer close(listened)
		pg.st.Listen(ctx, s.wake)
	}()
	go func() {
		defer close(pg.done)
		pg.leaseLoop(ctx)
		<-listened
	}()
}

// stop stops the goroutines started by startLoops and releases the data
// directory's lock.
func (pg *postgresAdmitter) stop() {
	s := pg.s
	if pg.cancel != nil {
		pg.cancel()
		<-pg.done
		s.mu.Lock()
		if pg.boundary != nil {
			pg.boundary.Stop()
		}
		s.mu.Unlock()
	}
	if pg.unlock != nil {
		pg.unlock()
		pg.unlock = nil
	}
}

// leaseLoop renews this sidecar's leases every third of the lease, sweeps
// expired ones every half lease and wakes a claim every sharedPoll.
func (pg *postgresAdmitter) leaseLoop(ctx context.Context) {
	s := pg.s
	renewEvery, sweepEvery := pg.lease/3, pg.lease/2
	tick := min(sharedPoll, renewEvery)
	var lastRenew, lastSweep time.Time
	for {
		t := s.clk.NewTimer(tick)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
		now := s.clk.Now()
		if now.Sub(lastRenew) >= renewEvery {
			c, cancel := context.WithTimeout(ctx, sharedCallTimeout)
			if _, err := pg.st.Renew(c, pg.owner, now.Add(pg.lease).UnixNano()); err != nil && ctx.Err() == nil {
				s.log.Error("renew run leases", "err", err)
			} else {
				lastRenew = now
			}
			cancel()
		}
		if now.Sub(lastSweep) >= sweepEvery {
			pg.sweep(ctx, now)
			lastSweep = now
		}
		s.wake()
	}
}

// sweepRequest is what a sweep at now looks at: the retry policy decides
// on a RUNNING run whose lease ended, and each definition's
// schedule_to_start_timeout ends the runs that waited too long.
func (pg *postgresAdmitter) sweepRequest(cfg *config, now time.Time) pgstore.SweepRequest {
	req := pgstore.SweepRequest{Now: now.UnixNano(), ScheduleToStart: map[string]int64{}, Decide: func(e pgstore.Expired) pgstore.Decision {
		reason := fmt.Sprintf("sidecar %s stopped renewing its lease while the worker held the run", e.Owner)
		d := cfg.defs[e.Run.Name]
		if d != nil && d.retry != nil {
			if ok, _ := d.retry.ShouldRetry(int(e.Run.Attempt), reason); ok {
				return pgstore.Decision{Status: store.Queued, Reason: reason}
			}
		}
		return pgstore.Decision{Status: store.Failed, Reason: reason}
	}}
	for _, d := range cfg.order {
		if d.scheduleToStart > 0 {
			req.ScheduleToStart[d.name] = int64(d.scheduleToStart)
		}
	}
	return req
}

// logSweep reports what a sweep took back.
func (pg *postgresAdmitter) logSweep(res pgstore.SweepResult) {
	s := pg.s
	if res.Requeued+res.Ended > 0 {
		s.log.Warn("runs of a sidecar whose lease expired were taken back", "requeued", res.Requeued,
			"ended", res.Ended, "rate_slots_refunded", res.Refunded)
	}
	if res.PermitsExpired > 0 {
		s.log.Warn("semaphore permit leases expired; permits returned", "permits", res.PermitsExpired)
	}
}

// sweep returns runs whose owner's lease expired to the queue (or
// ends them, as the retry policy says), frees expired permits and requeues
// retry waits that are due, then refreshes warden_runs from the store.
func (pg *postgresAdmitter) sweep(ctx context.Context, now time.Time) {
	s := pg.s
	cfg := s.cfgPtr.Load()
	if cfg == nil {
		return
	}
	c, cancel := context.WithTimeout(ctx, sharedCallTimeout)
	defer cancel()
	res, err := pg.st.Sweep(c, pg.sweepRequest(cfg, now))
	if err != nil {
		if ctx.Err() == nil {
			s.log.Error("sweep the shared queue", "err", err)
		}
		return
	}
	pg.logSweep(res)
	if err := s.loadCounts(c); err != nil && ctx.Err() == nil {
		s.log.Error("count runs", "err", err)
	}
}

// recover takes back, at start, what this sidecar (its owner id is
// kept across restarts) left in the shared store: deliveries that were in
// flight (STARTING) return to the queue at once, as the sweep returns
// those of an expired lease; runs the worker accepted (RUNNING) are this
// process's again — their leases renewed, their complete and heartbeat
// served here, start_to_close counting from their start and
// heartbeat_timeout from now, as with the embedded store. Runs of other
// sidecars are left to their owners and to the lease sweep.
func (pg *postgresAdmitter) recover(ctx context.Context) error {
	s := pg.s
	cfg := s.cfgPtr.Load()
	if cfg == nil {
		return nil
	}
	now := s.clk.Now()
	c, cancel := context.WithTimeout(ctx, sharedCallTimeout)
	defer cancel()
	held, res, err := pg.st.Restart(c, pg.owner, now.Add(pg.lease).UnixNano(), pg.sweepRequest(cfg, now))
	if err != nil {
		return err
	}
	pg.logSweep(res)
	for _, r := range held {
		pg.resume(r, now)
	}
	if len(held) > 0 || res.Requeued > 0 {
		s.log.Info("runs of this sidecar's previous process taken back", "owner", pg.owner,
			"running", len(held), "requeued_from_starting", res.Requeued, "rate_slots_refunded", res.Refunded)
	}
	return s.loadCounts(c)
}

// resume takes back a RUNNING run this sidecar holds in the shared
// store (the gates it holds are counted there, by owner).
func (pg *postgresAdmitter) resume(r store.Run, now time.Time) {
	s := pg.s
	cfg := s.cfgPtr.Load()
	var d *definition
	if cfg != nil {
		d = cfg.defs[r.Name]
	}
	s.mu.Lock()
	a := &active{seq: r.Seq, run: r, def: d, q: s.q.def(r.Name), key: r.Key, prio: r.Priority, queuedAt: r.QueuedAt,
		admittedAt: r.StartedAt, phase: phaseAsync, heartbeatAt: now.UnixNano()}
	s.running++
	s.active[r.Seq] = a
	a.mu.Lock()
	s.armRunTimer(a)
	a.mu.Unlock()
	s.mu.Unlock()
	// Its permits, like its heartbeat_timeout, count from the restart.
	pg.leasePermits(a, now.UnixNano()+int64(a.leaseTerm()))
}

// claimRequest describes this sidecar's gates for a claim at now.
func (pg *postgresAdmitter) claimRequest(cfg *config, now time.Time) pgstore.ClaimRequest {
	req := pgstore.ClaimRequest{
		Owner: pg.owner, Now: now.UnixNano(), Lease: pg.lease, Lanes: cfg.lanes, WorkerMax: cfg.workerMax,
		Defs: make(map[string]pgstore.ClaimDef, len(cfg.order)), Pools: map[string]pgstore.ClaimPool{},
		Semaphores: cfg.semaphores,
	}
	for _, d := range cfg.order {
		cd := pgstore.ClaimDef{Semaphores: d.semaphores}
		if d.key != nil {
			cd.KeyLimit = d.cfg.KeyConcurrency
		}
		if d.pool != nil {
			cd.Pool = d.pool.ID()
			p := pgstore.ClaimPool{Concurrency: d.poolCfg.Concurrency, Rate: d.poolCfg.Rate}
			if p.Rate > 0 {
				start, end := window.Bounds(now, d.poolCfg.Window)
				p.WindowStart, p.WindowEnd = start.UnixNano(), end.UnixNano()
			}
			req.Pools[cd.Pool] = p
		}
		req.Defs[d.name] = cd
	}
	return req
}

// claim claims what this sidecar may start now and delivers it.
func (pg *postgresAdmitter) claim() {
	s := pg.s
	cfg := s.cfgPtr.Load()
	s.mu.Lock()
	stopped := cfg == nil || s.draining || s.closed
	s.mu.Unlock()
	if stopped {
		return
	}
	now := s.clk.Now()
	ctx, cancel := context.WithTimeout(s.runCtx, sharedCallTimeout)
	res, err := pg.st.Claim(ctx, pg.claimRequest(cfg, now))
	cancel()
	if err != nil {
		// The poll tries again; a failing store must not spin.
		s.log.Error("claim runs from the shared queue", "err", err)
		return
	}
	s.mu.Lock()
	if res.WakeAt != 0 {
		pg.armBoundaryLocked(res.WakeAt, now)
	}
	if s.draining || s.closed {
		s.mu.Unlock()
		// Claimed while a drain began: left STARTING under this sidecar's
		// lease, which ends with the process; the sweep queues them again
		// with their rate slots refunded.
		if len(res.Runs) > 0 {
			s.log.Warn("runs claimed as the drain began are left to the lease sweep", "runs", len(res.Runs))
		}
		return
	}
	type claimed struct {
		a *active
		r store.Run
	}
	started := make([]claimed, 0, len(res.Runs))
	for _, r := range res.Runs {
		a := &active{seq: r.Seq, def: cfg.defs[r.Name], q: s.q.def(r.Name), key: r.Key, prio: r.Priority,
			queuedAt: r.QueuedAt, admittedAt: r.StartedAt}
		s.running++
		s.active[r.Seq] = a
		s.deliveries.Add(1)
		started = append(started, claimed{a, r})
	}
	s.mu.Unlock()
	for _, c := range started {
		go func() {
			defer s.deliveries.Done()
			d := c.a.def
			// A run back from a retry wait was counted by the budget already.
			if c.r.RetryAt == 0 && d != nil && d.retry != nil {
				d.retry.RecordExecution()
			}
			if d != nil && d.waitObs != nil {
				d.waitObs.Observe(time.Duration(c.a.admittedAt - c.a.queuedAt).Seconds())
			}
			c.r.RetryAt = 0
			s.moved(store.Queued, store.Starting)
			s.deliverRecorded(c.a, c.r)
		}()
	}
}

// armBoundaryLocked wakes a claim at the end of a pool window that held
// runs.
func (pg *postgresAdmitter) armBoundaryLocked(at int64, now time.Time) {
	s := pg.s
	if pg.boundaryAt != 0 && pg.boundaryAt <= at && pg.boundaryAt > now.UnixNano() {
		return
	}
	if pg.boundary != nil {
		pg.boundary.Stop()
	}
	pg.boundaryAt = at
	pg.boundary = s.clk.AfterFunc(time.Duration(at-now.UnixNano()), s.wake)
}

// leasePermits sets the lease of a run's permits in the shared
// store (the worker accepted it, or heartbeated).
func (pg *postgresAdmitter) leasePermits(a *active, until int64) {
	s := pg.s
	if a.def == nil || len(a.def.semaphores) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), sharedCallTimeout)
	defer cancel()
	if err := pg.st.LeasePermits(ctx, pg.owner, a.seq, until); err != nil {
		s.log.Error("lease semaphore permits", "run", s.formatID(a.seq), "err", err)
	}
}

// admitLocked: admissions come from claims (claim), outside the lock.
func (*postgresAdmitter) admitLocked(*config, time.Time) []*active { return nil }

func (*postgresAdmitter) reserveLocked(*config, *definition, string, int32, time.Time) *active {
	return nil
}

// enqueueLocked asks for a claim: the store is the queue's index.
func (pg *postgresAdmitter) enqueueLocked(*store.Run) { pg.s.wake() }

func (*postgresAdmitter) awaitLocked(uint64) *verdict { return nil }

// releasedLocked: the store counts a run's gates until its record leaves
// STARTING/RUNNING.
func (*postgresAdmitter) releasedLocked(*active) {}

// permitExpiredLocked: permits are leased in the store (the sweep).
func (*postgresAdmitter) permitExpiredLocked(*active, string) {}

// heldElsewhere: another sidecar sharing the queue admitted the run.
func (*postgresAdmitter) heldElsewhere(id, what string) error {
	return &Conflict{Msg: fmt.Sprintf("run %s is RUNNING on another sidecar sharing the queue: %s it through the sidecar that delivered it", id, what)}
}
