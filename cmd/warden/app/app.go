// Package app runs one warden process: it loads the policy, builds the
// governor, starts the admin listener and every component the policy turns
// on, reloads on SIGHUP, file change or POST /v1/policy/reload, and drains on
// shutdown. Tests start whole in-process instances through it.
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warden-dev/warden/governor"
	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/metrics"
	"github.com/warden-dev/warden/policy"
	"github.com/warden-dev/warden/proxy/admin"
	"github.com/warden-dev/warden/proxy/bridge"
	"github.com/warden-dev/warden/proxy/listener"
	"github.com/warden-dev/warden/scheduler"
)

// Options configure an App.
type Options struct {
	PolicyFile string
	DataDir    string
	Log        *slog.Logger
	Version    string
	Clock      clock.Clock // nil: the real clock
	// WatchFile turns on reloading when the policy file changes (on by
	// default in New; tests may turn it off).
	NoWatch bool
	// BackendPrefix starts every key written to a Redis backend
	// (window.DefaultRedisPrefix when empty). Sidecars share windows when
	// they share a Redis and a prefix; tests use a prefix of their own.
	BackendPrefix string
	// BackendTimeout, when set, replaces the short dial/read/write
	// deadlines of Redis calls (redisx defaults): tests that count exactly
	// on a busy machine use it so a stall is not taken for an outage.
	BackendTimeout time.Duration
}

// Component is a part of warden that a policy section turns on: a listener,
// the scheduler, the bridges. Apply starts it, reconfigures it for a
// reloaded policy, or stops it when its section is gone; Shutdown drains it.
type Component interface {
	Name() string
	Apply(ctx context.Context, c *governor.Controls) error
	Shutdown(ctx context.Context) error
}

// App is one running warden.
type App struct {
	opts    Options
	log     *slog.Logger
	clk     clock.Clock
	metrics *metrics.Metrics
	holder  *policy.Holder
	gov     *governor.Governor
	backend *backend

	components []Component
	// sched and bridges are also in components; kept typed for the
	// admin API's lists.
	sched   *scheduler.Scheduler
	bridges *bridge.Set
	started chan struct{} // closed once every listener is bound

	reloadMu sync.Mutex
	draining atomic.Bool // set (under reloadMu) when shutdown begins
	statusMu sync.Mutex
	// lastErr is the last reload's error ("" when it applied cleanly);
	// applyErr is what the running policy's components could not apply,
	// kept until a reload applies cleanly, so a refused file meanwhile
	// does not hide it and a reload of the same file is not "unchanged".
	lastErr      string
	applyErr     string
	lastReloadAt time.Time

	// adminSlot is the admin listener across reloads: a Slot, as the
	// data-plane listeners have, so a move binds the new address before the
	// old listener goes and a taken address leaves it where it was.
	adminSlot *listener.Slot
	adminAPI  *admin.API

	nofile uint64 // the file limit at start (listener limits)
}

// New loads and validates the policy and builds the process's controls; it
// binds nothing yet.
func New(opts Options) (*App, error) {
	if opts.Log == nil {
		opts.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if opts.Clock == nil {
		opts.Clock = clock.Real{}
	}
	p, err := policy.Load(opts.PolicyFile)
	if err != nil {
		return nil, fmt.Errorf("load policy: %w", err)
	}
	a := &App{
		opts:    opts,
		log:     opts.Log,
		clk:     opts.Clock,
		metrics: metrics.New(),
		holder:  policy.NewHolder(p),
		started: make(chan struct{}),
		nofile:  listener.FileLimit(),
	}
	be, err := newBackend(p.Backend, opts.BackendPrefix, opts.BackendTimeout, a.clk, a.metrics, a.log)
	if err != nil {
		return nil, err
	}
	a.backend = be
	a.gov = governor.New(a.clk, a.metrics, be.Counter())
	a.logWarnings(p)
	a.gov.Apply(p)
	a.components = a.buildComponents()
	a.adminSlot = a.newAdminSlot()
	a.metrics.PolicyInfo.WithLabelValues(p.Hash).Set(1)
	return a, nil
}

// Governor exposes the controls, for tests and embedding.
func (a *App) Governor() *governor.Governor { return a.gov }

// Started is closed once Run has bound every listener.
func (a *App) Started() <-chan struct{} { return a.started }

// AdminAddr is the admin listener's bound address ("" when off).
func (a *App) AdminAddr() string {
	return a.adminSlot.Addr()
}

// Run starts everything and blocks until ctx ends, reloading whenever hup
// delivers; then it drains within the policy's shutdown_grace.
func (a *App) Run(ctx context.Context, hup <-chan os.Signal) error {
	if err := a.start(ctx); err != nil {
		a.shutdown()
		return err
	}
	var fileChanged <-chan struct{}
	if !a.opts.NoWatch {
		w, err := watchFile(a.opts.PolicyFile, a.log)
		if err != nil {
			a.log.Warn("policy file not watched; reload with SIGHUP or POST /v1/policy/reload", "err", err)
		} else {
			defer w.Close()
			fileChanged = w.Changed()
		}
	}
	sweep := a.clk.NewTimer(sweepEvery)
	defer sweep.Stop()
	close(a.started)
	a.log.Info("warden running", "version", a.opts.Version, "policy", a.opts.PolicyFile,
		"hash", a.holder.Load().Hash, "admin", a.AdminAddr())
	for {
		select {
		case <-ctx.Done():
			return a.shutdown()
		case <-hup:
			a.log.Info("SIGHUP: reloading policy")
			_ = a.Reload()
		case <-fileChanged:
			a.log.Info("policy file changed: reloading")
			_ = a.Reload()
		case <-sweep.C():
			if n := a.backend.Sweep(); n > 0 {
				a.log.Debug("expired windows dropped", "count", n)
			}
			sweep.Reset(sweepEvery)
		}
	}
}

// sweepEvery bounds how long an expired window stays in memory.
const sweepEvery = 10 * time.Second

func (a *App) start(ctx context.Context) error {
	c := a.gov.Current()
	if err := a.applyAdmin(c.Policy); err != nil {
		return fmt.Errorf("start admin: %w", err)
	}
	for _, comp := range a.components {
		if err := comp.Apply(ctx, c); err != nil {
			return fmt.Errorf("start %s: %w", comp.Name(), err)
		}
	}
	return nil
}

// Reload re-reads the policy file and puts it in force.
//
// A file that fails to load or validate changes nothing: the running
// policy stays, and the error is returned (it is not an
// *admin.PartialApplyError), logged, shown in /v1/policy and counted in
// warden_policy_reload_errors_total.
//
// A valid file becomes the running policy (its hash in /v1/policy, its
// controls in the governor) even when a component cannot take it, such as
// a listener whose new address is taken: that component keeps its previous
// settings, and Reload returns an *admin.PartialApplyError, counted and
// shown like a refused file. The errors stay in /v1/policy's apply_error
// until a reload applies cleanly, and a reload of the same file applies it
// again rather than finding it unchanged, so the fix for a taken port is to
// free it and reload.
func (a *App) Reload() error {
	// Parsing holds the file's whole YAML tree, tens of times the file's
	// size, and all of it is garbage once the reload is done: give it back
	// now (after the lock is released). Left to the scavenger, a refused
	// 7 MB file kept warden at 460 MB resident; given back, 38 MB.
	defer debug.FreeOSMemory()
	a.reloadMu.Lock()
	defer a.reloadMu.Unlock()
	if a.draining.Load() {
		// The components refuse it anyway; a reload must not open a
		// listener or rebuild pools in the middle of the drain.
		return errShuttingDown
	}
	now := a.clk.Now()
	p, err := policy.Load(a.opts.PolicyFile)
	if err != nil {
		a.metrics.PolicyReloadErrors.Inc()
		a.setStatus(err.Error(), now)
		a.log.Error("policy reload refused; keeping the running policy", refusal(err)...)
		return err
	}
	old := a.holder.Load()
	a.statusMu.Lock()
	pending := a.applyErr
	a.statusMu.Unlock()
	if p.Hash == old.Hash && pending == "" {
		a.setStatus("", now)
		a.log.Info("policy unchanged", "hash", p.Hash)
		return nil
	}
	if p.Hash == old.Hash {
		a.log.Info("policy not fully applied: applying it again", "hash", p.Hash, "previous_errors", pending)
	}
	a.logWarnings(p)
	a.holder.Swap(p)
	c := a.gov.Apply(p)
	a.metrics.PolicyInfo.Reset()
	a.metrics.PolicyInfo.WithLabelValues(p.Hash).Set(1)
	var applyErrs []error
	if err := a.applyAdmin(p); err != nil {
		applyErrs = append(applyErrs, fmt.Errorf("admin: %w", err))
	}
	for _, comp := range a.components {
		if err := comp.Apply(context.Background(), c); err != nil {
			applyErrs = append(applyErrs, fmt.Errorf("%s: %w", comp.Name(), err))
		}
	}
	a.metrics.PolicyReloads.Inc()
	if err := errors.Join(applyErrs...); err != nil {
		a.metrics.PolicyReloadErrors.Inc()
		a.setApplied(err.Error(), now)
		a.log.Error("policy reloaded with errors: the components named kept their previous settings", "hash", p.Hash, "err", err)
		return &admin.PartialApplyError{Err: err}
	}
	a.setApplied("", now)
	a.log.Info("policy reloaded", "hash", p.Hash, "previous", old.Hash)
	return nil
}

// refusal is the log attributes of a refused reload: for a file that does
// not validate, how many errors it has and, in one attribute, the list
// policy.Errors keeps (the first policy.MaxErrors, then "... and N more
// errors"), so that a file with a mistake on every line is one log line.
func refusal(err error) []any {
	var errs policy.Errors
	if errors.As(err, &errs) {
		return []any{"error_count", errs.Len(), "errors", errs.Lines()}
	}
	return []any{"err", err}
}

// setStatus records the outcome of a reload that put nothing in force.
func (a *App) setStatus(errText string, at time.Time) {
	a.statusMu.Lock()
	a.lastErr, a.lastReloadAt = errText, at
	a.statusMu.Unlock()
}

// setApplied records the outcome of a reload that put a policy in force:
// errText lists what its components could not apply ("" for none), which
// is also the running policy's apply error from now on.
func (a *App) setApplied(errText string, at time.Time) {
	a.statusMu.Lock()
	a.lastErr, a.applyErr, a.lastReloadAt = errText, errText, at
	a.statusMu.Unlock()
}

func (a *App) logWarnings(p *policy.Policy) {
	for _, w := range p.WarningLines() {
		a.log.Warn("policy warning", "warning", w)
	}
	if w := listener.BudgetWarning(p, a.nofile); w != "" {
		a.log.Warn("policy warning: connection caps over the file limit", "warning", w)
	}
}

// errShuttingDown is what /readyz and a reload answer once the drain has
// begun.
var errShuttingDown = errors.New("draining: warden is shutting down")

// errStarting is what /readyz answers until every listener is bound.
var errStarting = errors.New("starting: listeners not all bound yet")

// acceptStopper is a component with listeners: StopAccepting closes them
// at once, and the component's Shutdown drains what they had accepted.
type acceptStopper interface{ StopAccepting() }

// admissionStopper is a component that starts work of its own (the
// scheduler's runs): StopAdmitting stops that at once, while the listeners
// that serve it drain; its Shutdown finishes the drain later.
type admissionStopper interface{ StopAdmitting() }

// shutdown drains warden within shutdown_grace:
//
//  1. /readyz answers 503 and reloads are refused from now on.
//  2. Every listener but admin's stops accepting at once (ingress, egress,
//     gRPC, RLS, bridges), and the scheduler stops admitting runs, so that
//     no component keeps taking or starting work while another one drains.
//  3. Those components drain together: each finishes what its listeners
//     accepted (keep-alive connections close after their request) until
//     the grace ends, then cuts what is left.
//  4. The others shut down in reverse start order once nothing can reach
//     them any more: the scheduler (after the ingress that serves its runs
//     API; queued runs are already durable), then the backend every
//     component counted in.
//  5. The admin listener closes last, so that probes and scrapes see the
//     whole drain.
//
// Every step shares one deadline: the whole drain takes at most the grace.
func (a *App) shutdown() error {
	grace := a.holder.Load().ShutdownGrace
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	// Under reloadMu: a reload in progress finishes first, and none starts
	// after, so no listener is bound behind StopAccepting's back.
	a.reloadMu.Lock()
	a.draining.Store(true)
	a.reloadMu.Unlock()
	var front, back []Component
	for _, comp := range a.components {
		if s, ok := comp.(admissionStopper); ok {
			s.StopAdmitting()
		}
		if s, ok := comp.(acceptStopper); ok {
			s.StopAccepting()
			front = append(front, comp)
		} else {
			back = append(back, comp)
		}
	}
	// Logged once no listener but admin's accepts (tests wait for it).
	a.log.Info("draining", "grace", grace, "listeners", "closed", "admin", "serving")
	var errs []error
	// A drain the grace ran out on is what shutdown_grace is for: what was
	// still in flight is cut, and that is a warning, not a failed shutdown
	// (SIGTERM exits 0). Anything else, such as a run store that fails to
	// close, is an error.
	note := func(name string, err error) {
		switch {
		case err == nil:
		case graceOver(err):
			a.log.Warn("shutdown_grace ended before the drain did: closed the connections left", "component", name, "grace", grace, "err", err)
		default:
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
	}
	frontErrs := make([]error, len(front))
	var wg sync.WaitGroup
	for i, comp := range front {
		wg.Go(func() { frontErrs[i] = comp.Shutdown(ctx) })
	}
	wg.Wait()
	for i, comp := range front {
		note(comp.Name(), frontErrs[i])
	}
	for i := len(back) - 1; i >= 0; i-- {
		note(back[i].Name(), back[i].Shutdown(ctx))
	}
	note("admin", a.adminSlot.Shutdown(ctx, func() error { return nil }))
	if err := errors.Join(errs...); err != nil {
		return err
	}
	a.log.Info("stopped")
	return nil
}

// graceOver reports whether err says only that the grace period ended:
// every error it joins is the deadline.
func graceOver(err error) bool {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			if !graceOver(e) {
				return false
			}
		}
		return true
	}
	return errors.Is(err, context.DeadlineExceeded)
}
