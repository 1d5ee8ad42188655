// Package scheduler is warden's run queue (SPEC §6): callers submit runs on
// the ingress listener, the scheduler stores each durably before answering
// 202, and delivers it to the worker when every gate admits it — lanes,
// worker_max_concurrent, key_concurrency, the definition's pool and its
// named semaphores. Busy never means refused: a run waits, naming the
// control that holds it, until capacity frees; a freed slot admits the next
// run at once. See README.md for the API and its guarantees.
//
// Concurrency: one mutex (Scheduler.mu) guards the admission state — the
// queue index, the running runs, semaphores and timers. It is never held
// across I/O: admission decides under the lock, and each admitted run is
// persisted (STARTING) and delivered by its own goroutine.
package scheduler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/warden-dev/warden/governor"
	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/metrics"
	"github.com/warden-dev/warden/governor/pool"
	"github.com/warden-dev/warden/governor/window"
	"github.com/warden-dev/warden/scheduler/store"
	"github.com/warden-dev/warden/scheduler/store/pgstore"
)

// Options configure a Scheduler.
type Options struct {
	Clock   clock.Clock      // nil: the real clock
	Metrics *metrics.Metrics // nil: no metrics
	Log     *slog.Logger     // nil: discard
	// DataDir holds the bbolt store (DataDir/runs.db) when
	// scheduler.store.kind is bbolt. With a shared (postgres) store it
	// holds this sidecar's owner id (DataDir/sidecar-id), kept across
	// restarts, and is locked (DataDir/sidecar.lock) while the scheduler
	// runs; "" (tests) picks a new owner id at every start.
	DataDir string
	// Store, when set, is used instead of the store the policy names; the
	// caller owns it (the scheduler does not close it). Tests and the bench
	// use it.
	Store store.Store
	// Deliver, when set, replaces the HTTP delivery to ingress.worker (the
	// bench uses an in-process worker to measure the gates alone).
	Deliver DeliverFunc
	// Owner names this sidecar in a shared (postgres) store; "" uses the
	// id kept in DataDir (see DataDir).
	Owner string
	// Lease is how long a run claimed from a shared store stays with this
	// sidecar without renewal; 0: DefaultLease.
	Lease time.Duration
	// Counter is the window counter the policy's pools count in
	// (governor.Counter). When it is the Redis counter and the run store
	// is this sidecar's own (bbolt, memory), lanes and semaphore permits
	// are leases in that Redis, shared by every sidecar on it
	// (admit_redis.go); nil or in-process, they are this sidecar's.
	Counter window.Counter
}

// StoreFile is the bbolt store's file name inside the data directory.
const StoreFile = "runs.db"

// Scheduler is the run queue component. The zero value is not usable; call
// New.
type Scheduler struct {
	opts Options
	clk  clock.Clock
	log  *slog.Logger
	m    *metrics.Metrics

	cfgPtr atomic.Pointer[config] // nil while stopped
	scope  atomic.Pointer[string] // the store's store.IDScope, "" without one: run ids (formatID)
	gauges []prometheus.Gauge     // warden_runs by store status; nil without metrics
	client *http.Client
	deliv  DeliverFunc

	mu       sync.Mutex
	st       store.Store
	adm      admitter // how runs are admitted: chosen at start (chooseAdmitter)
	ownStore bool
	q        *queue
	sems     map[string]*semaphore
	active   map[uint64]*active       // admitted runs: STARTING or RUNNING
	waits    map[uint64]clock.Timer   // RETRY_WAIT runs and their timers
	pending  map[uint64]*pendingWrite // writes the store failed, retried (rewrite.go)
	npending atomic.Int64             // len(pending), read without mu
	running  int
	pass     uint64 // admission pass number (definition.skip)
	draining bool   // admission has stopped (beginDrain)
	// stopCalled: stop has begun; draining may come first (StopAdmitting).
	stopCalled bool
	// recovering holds admission back while Start rebuilds the queue and
	// the running set from the store: a run admitted before the runs that
	// were running are counted would exceed lanes and keys, and one
	// admitted before the interrupted runs are back in the queue would
	// pass them.
	recovering bool
	closed     bool
	started    bool
	subscribed map[*pool.Pool]bool
	sweep      clock.Timer
	sweepAt    int64
	purgeT     clock.Timer // the next purge of finished runs (purge.go); nil without retention
	purgeAt    int64       // when purgeT fires, unix nanoseconds
	watch      runWatch    // who waits for a run to end (bridge sessions)

	runCtx     context.Context // store calls of deliveries; cancelled when a drain runs out of time
	cancelRuns context.CancelFunc
	stopping   atomic.Bool
	deliveries sync.WaitGroup // delivery goroutines
	calls      sync.WaitGroup // API calls and timer callbacks
	// closeMu orders enter against stop: readers are API calls and timer
	// callbacks registering in calls.
	closeMu  sync.RWMutex
	shut     bool
	kick     chan struct{}
	freed    chan *active
	loopDone chan struct{}
	quit     chan struct{}
}

// freedBuffer lets completions hand over without waiting for the loop.
const freedBuffer = 4096

// New returns a stopped scheduler; Apply starts it.
func New(opts Options) *Scheduler {
	if opts.Clock == nil {
		opts.Clock = clock.Real{}
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	s := &Scheduler{
		opts: opts, clk: opts.Clock, log: opts.Log, m: opts.Metrics, shut: true,
		subscribed: map[*pool.Pool]bool{},
		kick:       make(chan struct{}, 1),
		freed:      make(chan *active, freedBuffer),
	}
	s.client = newWorkerClient()
	s.deliv = opts.Deliver
	if s.deliv == nil {
		s.deliv = s.httpDeliver
	}
	return s
}

// Name implements app.Component.
func (s *Scheduler) Name() string { return "scheduler" }

// Apply starts the scheduler for c's policy, reconfigures it on a reload
// (lanes, definitions, semaphores, pools and timeouts take effect at once),
// or stops it when the scheduler section is gone.
func (s *Scheduler) Apply(ctx context.Context, c *governor.Controls) error {
	if c.Policy.Scheduler == nil {
		if !s.isStarted() {
			return nil
		}
		grace := c.Policy.ShutdownGrace
		sctx, cancel := context.WithTimeout(context.Background(), grace)
		defer cancel()
		return s.stop(sctx)
	}
	prev := s.cfgPtr.Load()
	cfg, err := compile(c, prev, s.clk, s.m)
	if err != nil {
		return err
	}
	if !s.isStarted() {
		return s.start(ctx, c, cfg)
	}
	var keep error
	if prev != nil && prev.storeKind != cfg.storeKind && s.opts.Store == nil {
		keep = fmt.Errorf("scheduler.store.kind changed from %s to %s: a restart is needed; runs stay in the %s store until then", prev.storeKind, cfg.storeKind, prev.storeKind)
		cfg.storeKind, cfg.storeURL = prev.storeKind, prev.storeURL
	} else if prev != nil && prev.storeURL != cfg.storeURL && s.opts.Store == nil {
		keep = errors.New("scheduler.store.url changed: a restart is needed; runs stay in the store opened at start until then")
		cfg.storeURL = prev.storeURL
	}
	now := s.clk.Now()
	s.mu.Lock()
	s.reconfigureLocked(c, cfg)
	started := s.admitLocked(now)
	s.mu.Unlock()
	s.launch(started)
	return keep
}

func (s *Scheduler) isStarted() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.started
}

// start opens the store, recovers the runs it holds and starts admitting.
func (s *Scheduler) start(ctx context.Context, c *governor.Controls, cfg *config) error {
	st, own, err := s.openStore(ctx, cfg)
	if err != nil {
		return err
	}
	adm, gauges, err := s.chooseAdmitter(st)
	if err != nil {
		if own {
			st.Close()
		}
		return err
	}
	s.mu.Lock()
	s.st, s.ownStore = st, own
	scope := ""
	if sc, ok := st.(store.IDScoper); ok {
		scope = sc.IDScope()
	}
	s.scope.Store(&scope)
	s.adm, s.gauges = adm, gauges
	s.q = newQueue()
	s.sems = map[string]*semaphore{}
	s.active = map[uint64]*active{}
	s.waits = map[uint64]clock.Timer{}
	s.pending = map[uint64]*pendingWrite{}
	s.npending.Store(0)
	s.running, s.draining, s.stopCalled, s.closed, s.started = 0, false, false, false, true
	s.recovering = true
	s.runCtx, s.cancelRuns = context.WithCancel(context.Background())
	s.stopping.Store(false)
	s.closeMu.Lock()
	s.shut = false
	s.closeMu.Unlock()
	s.quit, s.loopDone = make(chan struct{}), make(chan struct{})
	s.reconfigureLocked(c, cfg)
	s.mu.Unlock()
	go s.loop()
	err = s.adm.start(ctx, c)
	s.mu.Lock()
	s.recovering = false
	s.mu.Unlock()
	if err != nil {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = s.stop(sctx)
		return fmt.Errorf("recover runs: %w", err)
	}
	s.admitAndLaunch()
	return nil
}

func (s *Scheduler) openStore(ctx context.Context, cfg *config) (store.Store, bool, error) {
	if s.opts.Store != nil {
		return s.opts.Store, false, nil
	}
	switch cfg.storeKind {
	case "memory":
		return store.NewMemory(), true, nil
	case "", "bbolt":
		dir := s.opts.DataDir
		if dir == "" {
			dir = "data"
		}
		st, err := store.OpenBolt(filepath.Join(dir, StoreFile))
		if err != nil {
			return nil, false, err
		}
		return st, true, nil
	case "postgres":
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		st, err := pgstore.Open(ctx, cfg.storeURL)
		if err != nil {
			return nil, false, err
		}
		return st, true, nil
	}
	return nil, false, fmt.Errorf("scheduler.store.kind %s is not supported by this build; use bbolt (the default), postgres or memory", cfg.storeKind)
}

// reconfigureLocked publishes cfg and brings the admission state in line
// with it.
func (s *Scheduler) reconfigureLocked(c *governor.Controls, cfg *config) {
	s.cfgPtr.Store(cfg)
	s.applySemaphores(cfg.semaphores)
	for _, d := range cfg.order {
		dq := s.q.def(d.name)
		limit := 0
		if d.key != nil {
			limit = d.cfg.KeyConcurrency
		}
		s.q.setKeyLimit(dq, limit)
		if d.scheduleToStart > 0 {
			s.q.enableFIFO(dq)
		} else {
			s.q.disableFIFO(dq)
			dq.stopTimer()
		}
		s.armSTSLocked(d)
		if d.pool != nil && !s.subscribed[d.pool] {
			s.subscribed[d.pool] = true
			// Called by the pool outside its lock when capacity may have
			// freed (a release, a refund, a window boundary, a reset).
			d.pool.OnFree(s.wake)
		}
	}
	for name, dq := range s.q.defs {
		if cfg.defs[name] == nil {
			// Removed from the policy: its runs wait (control
			// "definition") until it comes back; no timeouts meanwhile.
			dq.stopTimer()
		}
	}
	s.armSweepLocked()
	s.armPurgeLocked(cfg)
}

// wake asks the admission loop for a pass; it never blocks.
func (s *Scheduler) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// loop releases ended runs and runs admission passes: for completions
// (batched), and for events from outside the scheduler's own paths (pool
// capacity freed elsewhere, window boundaries). Submissions admit inline.
func (s *Scheduler) loop() {
	defer close(s.loopDone)
	batch := make([]*active, 0, 256)
	for {
		select {
		case a := <-s.freed:
			batch = append(batch[:0], a)
		drain:
			for len(batch) < cap(batch) {
				select {
				case a := <-s.freed:
					batch = append(batch, a)
				default:
					break drain
				}
			}
			now := s.clk.Now()
			s.mu.Lock()
			for _, a := range batch {
				s.releaseLocked(a)
			}
			started := s.admitLocked(now)
			s.mu.Unlock()
			clear(batch)
			s.launch(started)
			s.adm.claim()
		case <-s.kick:
			s.admitAndLaunch()
			s.adm.claim()
		case <-s.quit:
			// Every sender has finished by now; release what they left.
			s.mu.Lock()
			for {
				select {
				case a := <-s.freed:
					s.releaseLocked(a)
					continue
				default:
				}
				break
			}
			s.mu.Unlock()
			return
		}
	}
}

func (s *Scheduler) admitAndLaunch() {
	now := s.clk.Now()
	s.mu.Lock()
	started := s.admitLocked(now)
	s.mu.Unlock()
	s.launch(started)
}

// enter registers an API call or timer callback; false once the scheduler
// is closed. Every true must be paired with leave.
func (s *Scheduler) enter() bool {
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.shut {
		return false
	}
	s.calls.Add(1)
	return true
}

func (s *Scheduler) leave() { s.calls.Done() }

// pinger is a store that can tell whether it answers (a shared store).
type pinger interface{ Ping(context.Context) error }

// Ready reports whether the scheduler serves runs: its store is open and,
// when it can tell, answers.
func (s *Scheduler) Ready() error {
	if s.cfgPtr.Load() == nil {
		return nil // no scheduler section: nothing to be ready for
	}
	s.mu.Lock()
	open, st := s.started && !s.closed, s.st
	s.mu.Unlock()
	if !open {
		return errors.New("run store not open")
	}
	if p, ok := st.(pinger); ok {
		return p.Ping(context.Background())
	}
	return nil
}

// Shutdown drains: admission stops, deliveries in flight may finish until
// ctx ends, then the ones left are abandoned in STARTING (a restart puts
// them back in the queue with their rate slot refunded), and the store is
// flushed and closed. Queued runs are already durable.
func (s *Scheduler) Shutdown(ctx context.Context) error {
	if !s.isStarted() {
		return nil
	}
	return s.stop(ctx)
}

// StopAdmitting begins the drain when warden's shutdown begins: no run is
// admitted from then on. The ingress that serves the runs API drains before
// Shutdown is called, and a queue worked off meanwhile would start runs the
// grace then abandons, to be delivered again after the restart. Workers may
// still complete and heartbeat the runs they hold, deliveries in flight go
// on, and runs submitted meanwhile are stored and wait.
func (s *Scheduler) StopAdmitting() { s.beginDrain() }

// beginDrain stops admission, retry waits and the sweep, once.
func (s *Scheduler) beginDrain() {
	s.mu.Lock()
	if !s.started || s.draining {
		s.mu.Unlock()
		return
	}
	s.draining = true
	for _, t := range s.waits {
		t.Stop()
	}
	for _, dq := range s.q.defs {
		dq.stopTimer()
	}
	if s.sweep != nil {
		s.sweep.Stop()
	}
	if s.purgeT != nil {
		s.purgeT.Stop()
		s.purgeT, s.purgeAt = nil, 0
	}
	inFlight := 0
	for _, a := range s.active {
		if a.getPhase() != phaseAsync {
			inFlight++
		}
	}
	s.mu.Unlock()
	s.log.Info("scheduler draining", "deliveries_in_flight", inFlight)
}

func (s *Scheduler) stop(ctx context.Context) error {
	s.mu.Lock()
	if !s.started || s.stopCalled {
		s.mu.Unlock()
		return nil
	}
	s.stopCalled = true
	s.mu.Unlock()
	s.beginDrain()

	done := make(chan struct{})
	go func() { s.deliveries.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		// Not an error: the grace is the operator's bound. What is still in
		// flight stays STARTING and a restart queues it again.
		s.stopping.Store(true)
		s.cancelRuns()
		s.mu.Lock()
		abandoned := 0
		for _, a := range s.active {
			if a.getPhase() == phaseDelivering {
				a.ctx.cancel()
				abandoned++
			}
		}
		s.mu.Unlock()
		<-done
		s.log.Warn("shutdown_grace ended with deliveries in flight; they stay STARTING and a restart queues them again",
			"abandoned", abandoned)
	}
	s.closeMu.Lock()
	s.shut = true
	s.closeMu.Unlock()
	s.mu.Lock()
	s.closed = true
	for _, a := range s.active {
		a.mu.Lock()
		if a.timer != nil {
			a.timer.Stop()
		}
		a.mu.Unlock()
	}
	for seq, p := range s.pending {
		p.timer.Stop()
		delete(s.pending, seq)
		s.log.Warn("closed with a run's record not written; the restart recovers the run", "run", s.formatID(seq), "record", p.r.Status.String())
	}
	s.npending.Store(0)
	s.mu.Unlock()
	s.calls.Wait()
	close(s.quit)
	<-s.loopDone
	s.adm.stop()
	s.cancelRuns()
	s.client.CloseIdleConnections()
	var err error
	if s.ownStore {
		if err = s.st.Close(); err != nil {
			err = fmt.Errorf("close run store: %w", err)
		}
	}
	s.mu.Lock()
	s.started = false
	s.mu.Unlock()
	s.cfgPtr.Store(nil)
	return err
}
