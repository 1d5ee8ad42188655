package scheduler

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

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
// scheduler delivers them exactly as it delivers what its own admitter
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

type shared struct {
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

// startShared starts the listener and the lease loop.
func (s *Scheduler) startShared() {
	sh := s.shared
	ctx, cancel := context.WithCancel(context.Background())
	sh.cancel, sh.done = cancel, make(chan struct{})
	listened := make(chan struct{})
	go func() {
		defer close(listened)
		sh.st.Listen(ctx, s.wake)
	}()
	go func() {
		defer close(sh.done)
		s.leaseLoop(ctx)
		<-listened
	}()
}

// stopShared stops the goroutines started by startShared.
func (s *Scheduler) stopShared() {
	sh := s.shared
	if sh == nil || sh.cancel == nil {
		return
	}
	sh.cancel()
	<-sh.done
	s.mu.Lock()
	if sh.boundary != nil {
		sh.boundary.Stop()
	}
	s.mu.Unlock()
}

// leaseLoop renews this sidecar's leases every third of the lease, sweeps
// expired ones every half lease and wakes a claim every sharedPoll.
func (s *Scheduler) leaseLoop(ctx context.Context) {
	sh := s.shared
	renewEvery, sweepEvery := sh.lease/3, sh.lease/2
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
			if _, err := sh.st.Renew(c, sh.owner, now.Add(sh.lease).UnixNano()); err != nil && ctx.Err() == nil {
				s.log.Error("renew run leases", "err", err)
			} else {
				lastRenew = now
			}
			cancel()
		}
		if now.Sub(lastSweep) >= sweepEvery {
			s.sweepShared(ctx, now)
			lastSweep = now
		}
		s.wake()
	}
}

// sweepRequest is what a sweep at now looks at: the retry policy decides
// on a RUNNING run whose lease ended, and each definition's
// schedule_to_start_timeout ends the runs that waited too long.
func (s *Scheduler) sweepRequest(cfg *config, now time.Time) pgstore.SweepRequest {
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
func (s *Scheduler) logSweep(res pgstore.SweepResult) {
	if res.Requeued+res.Ended > 0 {
		s.log.Warn("runs of a sidecar whose lease expired were taken back", "requeued", res.Requeued,
			"ended", res.Ended, "rate_slots_refunded", res.Refunded)
	}
	if res.PermitsExpired > 0 {
		s.log.Warn("semaphore permit leases expired; permits returned", "permits", res.PermitsExpired)
	}
}

// sweepShared returns runs whose owner's lease expired to the queue (or
// ends them, as the retry policy says), frees expired permits and requeues
// retry waits that are due, then refreshes warden_runs from the store.
func (s *Scheduler) sweepShared(ctx context.Context, now time.Time) {
	cfg := s.cfgPtr.Load()
	if cfg == nil {
		return
	}
	c, cancel := context.WithTimeout(ctx, sharedCallTimeout)
	defer cancel()
	res, err := s.shared.st.Sweep(c, s.sweepRequest(cfg, now))
	if err != nil {
		if ctx.Err() == nil {
			s.log.Error("sweep the shared queue", "err", err)
		}
		return
	}
	s.logSweep(res)
	if err := s.loadCounts(c); err != nil && ctx.Err() == nil {
		s.log.Error("count runs", "err", err)
	}
}

// recoverShared takes back, at start, what this sidecar (its owner id is
// kept across restarts) left in the shared store: deliveries that were in
// flight (STARTING) return to the queue at once, as the sweep returns
// those of an expired lease; runs the worker accepted (RUNNING) are this
// process's again — their leases renewed, their complete and heartbeat
// served here, start_to_close counting from their start and
// heartbeat_timeout from now, as with the embedded store. Runs of other
// sidecars are left to their owners and to the lease sweep.
func (s *Scheduler) recoverShared(ctx context.Context) error {
	sh := s.shared
	cfg := s.cfgPtr.Load()
	if cfg == nil {
		return nil
	}
	now := s.clk.Now()
	c, cancel := context.WithTimeout(ctx, sharedCallTimeout)
	defer cancel()
	held, res, err := sh.st.Restart(c, sh.owner, now.Add(sh.lease).UnixNano(), s.sweepRequest(cfg, now))
	if err != nil {
		return err
	}
	s.logSweep(res)
	for _, r := range held {
		s.resumeShared(r, now)
	}
	if len(held) > 0 || res.Requeued > 0 {
		s.log.Info("runs of this sidecar's previous process taken back", "owner", sh.owner,
			"running", len(held), "requeued_from_starting", res.Requeued, "rate_slots_refunded", res.Refunded)
	}
	return s.loadCounts(c)
}

// resumeShared takes back a RUNNING run this sidecar holds in the shared
// store (the gates it holds are counted there, by owner).
func (s *Scheduler) resumeShared(r store.Run, now time.Time) {
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
	s.leaseSharedPermits(a, now.UnixNano()+int64(a.leaseTerm()))
}

// claimRequest describes this sidecar's gates for a claim at now.
func (s *Scheduler) claimRequest(cfg *config, now time.Time) pgstore.ClaimRequest {
	sh := s.shared
	req := pgstore.ClaimRequest{
		Owner: sh.owner, Now: now.UnixNano(), Lease: sh.lease, Lanes: cfg.lanes, WorkerMax: cfg.workerMax,
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

// claimAndLaunch claims what this sidecar may start now and delivers it.
func (s *Scheduler) claimAndLaunch() {
	cfg := s.cfgPtr.Load()
	s.mu.Lock()
	stopped := cfg == nil || s.draining || s.closed
	s.mu.Unlock()
	if stopped {
		return
	}
	now := s.clk.Now()
	ctx, cancel := context.WithTimeout(s.runCtx, sharedCallTimeout)
	res, err := s.shared.st.Claim(ctx, s.claimRequest(cfg, now))
	cancel()
	if err != nil {
		// The poll tries again; a failing store must not spin.
		s.log.Error("claim runs from the shared queue", "err", err)
		return
	}
	s.mu.Lock()
	if res.WakeAt != 0 {
		s.armBoundaryLocked(res.WakeAt, now)
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
func (s *Scheduler) armBoundaryLocked(at int64, now time.Time) {
	sh := s.shared
	if sh.boundaryAt != 0 && sh.boundaryAt <= at && sh.boundaryAt > now.UnixNano() {
		return
	}
	if sh.boundary != nil {
		sh.boundary.Stop()
	}
	sh.boundaryAt = at
	sh.boundary = s.clk.AfterFunc(time.Duration(at-now.UnixNano()), s.wake)
}

// leaseSharedPermits sets the lease of a run's permits in the shared
// store (the worker accepted it, or heartbeated).
func (s *Scheduler) leaseSharedPermits(a *active, until int64) {
	if s.shared == nil || a.def == nil || len(a.def.semaphores) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), sharedCallTimeout)
	defer cancel()
	if err := s.shared.st.LeasePermits(ctx, s.shared.owner, a.seq, until); err != nil {
		s.log.Error("lease semaphore permits", "run", s.formatID(a.seq), "err", err)
	}
}

// sharedQueues is GET /v1/queues read from the shared store: every
// sidecar's waiting and admitted runs, and the control holding each
// definition's and key's next run, as the shared gates read now (a view:
// only a claim decides).
func (s *Scheduler) sharedQueues(now time.Time) []QueueState {
	out := []QueueState{}
	cfg := s.cfgPtr.Load()
	var keyed []string
	if cfg != nil {
		for _, d := range cfg.order {
			if d.key != nil && d.cfg.KeyConcurrency > 0 {
				keyed = append(keyed, d.name)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), sharedCallTimeout)
	defer cancel()
	defs, keys, err := s.shared.st.QueueStats(ctx, keyed)
	if err != nil {
		s.log.Error("read queue state", "err", err)
		return out
	}
	age := func(oldest int64) float64 {
		if oldest == 0 {
			return 0
		}
		return time.Duration(now.UnixNano() - oldest).Seconds()
	}
	type agg struct {
		depth, running int
		oldest         int64
	}
	pools := map[string]*agg{}
	var poolIDs []string
	ki := 0
	for _, g := range defs {
		row := QueueState{Scope: "definition", Definition: g.Name, Depth: g.Depth, OldestAgeSeconds: age(g.Oldest), Running: g.Admitted}
		var keyRows []QueueState
		// The definition's next run is the oldest waiting one whose key
		// has room (its key row's control is the row's); when every
		// waiting key is full, the key holds it.
		var next *pgstore.GroupStat
		var nextControl string
		for ; ki < len(keys) && keys[ki].Name <= g.Name; ki++ {
			if keys[ki].Name != g.Name {
				continue
			}
			k := keys[ki]
			kr := QueueState{Scope: "key", Definition: g.Name, Key: &k.Key, Depth: k.Depth,
				OldestAgeSeconds: age(k.Oldest), Running: k.Admitted}
			if k.Depth > 0 && cfg != nil && cfg.defs[g.Name] != nil {
				kr.Control = s.sharedControl(ctx, g.Name, k.Key, now)
				if kr.Control != ControlKey && (next == nil || k.Oldest < next.Oldest) {
					next, nextControl = &keys[ki], kr.Control
				}
			}
			keyRows = append(keyRows, kr)
		}
		switch {
		case g.Depth == 0, cfg == nil:
		case cfg.defs[g.Name] == nil:
			row.Control = ControlDefinition
		case len(keyRows) == 0:
			row.Control = s.sharedControl(ctx, g.Name, "", now)
		case next == nil:
			row.Control = ControlKey
		default:
			row.Control = nextControl
		}
		out = append(out, row)
		out = append(out, keyRows...)
		if cfg != nil {
			if d := cfg.defs[g.Name]; d != nil && d.pool != nil {
				p := pools[d.pool.ID()]
				if p == nil {
					p = &agg{}
					pools[d.pool.ID()] = p
					poolIDs = append(poolIDs, d.pool.ID())
				}
				p.depth += g.Depth
				p.running += g.Admitted
				if g.Depth > 0 && (p.oldest == 0 || g.Oldest < p.oldest) {
					p.oldest = g.Oldest
				}
			}
		}
	}
	slices.Sort(poolIDs)
	for _, id := range poolIDs {
		p := pools[id]
		out = append(out, QueueState{Scope: "pool", Pool: id, Depth: p.depth, OldestAgeSeconds: age(p.oldest), Running: p.running})
	}
	return out
}

// sharedSemaphores is GET /v1/semaphores with the permits held across
// every sidecar.
func (s *Scheduler) sharedSemaphores(now time.Time) []SemaphoreState {
	cfg := s.cfgPtr.Load()
	out := []SemaphoreState{}
	if cfg == nil {
		return out
	}
	ctx, cancel := context.WithTimeout(context.Background(), sharedCallTimeout)
	defer cancel()
	held, err := s.shared.st.PermitsHeld(ctx, now.UnixNano())
	if err != nil {
		s.log.Error("read semaphore permits", "err", err)
	}
	for name, permits := range cfg.semaphores {
		out = append(out, SemaphoreState{Name: name, Permits: permits, Held: held[name]})
	}
	slices.SortFunc(out, func(a, b SemaphoreState) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// sharedControl names the control holding a waiting run in the shared
// queue, in the order the in-process admitter names them: the run's own
// gates (key, semaphores, pool), then the shared ones; "" when no gate is
// full (the run waits only for a claim loop, or behind runs that will take
// the lanes left).
func (s *Scheduler) sharedControl(ctx context.Context, name, key string, now time.Time) string {
	cfg := s.cfgPtr.Load()
	if cfg == nil {
		return ControlLanes
	}
	if cfg.defs[name] == nil {
		return ControlDefinition
	}
	ctx, cancel := context.WithTimeout(ctx, sharedCallTimeout)
	defer cancel()
	h, err := s.shared.st.Holding(ctx, s.claimRequest(cfg, now), name, key)
	switch {
	case err != nil:
		s.log.Error("read the gates holding a run", "definition", name, "err", err)
		return ControlLanes
	case h.Key:
		return ControlKey
	case h.Semaphore:
		return ControlSemaphore
	case h.PoolConcurrency:
		return ControlPoolConc
	case h.PoolRate:
		return ControlPoolRate
	case h.Worker && !h.Lanes:
		return ControlWorker
	case h.Lanes:
		return ControlLanes
	}
	// No gate is full: the run only waits for a claim loop to take it, a
	// moment away, and naming a gate would send the reader (and the
	// rejection metric) after one that holds nothing (SPEC §4).
	return ""
}

// sharedControls fills in the control of every waiting run of views from
// the shared store, one read per definition and key.
func (s *Scheduler) sharedControls(ctx context.Context, views []RunView, now time.Time) {
	type nk struct{ name, key string }
	seen := map[nk]string{}
	for i := range views {
		v := &views[i]
		if !v.AwaitingAdmission {
			continue
		}
		k := nk{v.Name, v.Key}
		c, ok := seen[k]
		if !ok {
			c = s.sharedControl(ctx, v.Name, v.Key, now)
			seen[k] = c
		}
		if c == "" {
			v.Control = nil
			continue
		}
		v.Control = &c
	}
}
