// Package bridge is warden's bridge connection governor (SPEC §7): one TCP
// listener per bridge of the policy in front of one database, holding at
// most max_connections live upstream connections per sidecar. Further
// clients wait first in, first out, up to wait_timeout; orphans are reaped
// (client gone, idle, idle in transaction, max_lifetime, run ended) and
// counted by reason.
//
// Protocol tcp is a protocol-blind capped pipe. Protocol postgres reads the
// startup message (declining TLS and GSS encryption), forwards cancel
// requests to the right server connection, follows ReadyForQuery to know
// whether a session is idle, in a transaction or busy — with a frame scanner
// that never parses or copies query payloads — and keeps the connections of
// password-less logins for the next client with the same login (session
// pooling). See README.md.
package bridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/warden-dev/warden/governor"
	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/metrics"
	"github.com/warden-dev/warden/policy"
)

// Options configure the bridges of one warden process.
type Options struct {
	Clock   clock.Clock // nil: the real clock
	Metrics *metrics.Metrics
	Log     *slog.Logger
	// Runs binds sessions of clients with application_name=run:<id> to
	// that run. nil: binding off (logged once).
	Runs RunTracker
	// StartupTimeout bounds how long a Postgres client may take to send its
	// startup message (0: 15s).
	StartupTimeout time.Duration
	// DialTimeout bounds connecting to an upstream (0: 10s).
	DialTimeout time.Duration
	// KeepAlive is applied to accepted client sockets and upstream
	// connections so that a vanished peer is noticed (zero: enabled, probes
	// after 15s idle, every 5s, 3 probes).
	KeepAlive net.KeepAliveConfig
}

// Set is every bridge of the policy: the "bridges" component.
type Set struct {
	opts     Options
	clk      clock.Clock
	dialer   net.Dialer
	lc       net.ListenConfig
	stopHook func()
	// keptAtEOF, if set (tests), runs when a waiting tcp client has sent
	// bytes and then EOF and keeps its turn (watchClient). Set before any
	// bridge starts.
	keptAtEOF func()

	mu         sync.Mutex
	order      []string // policy order, for listings
	bridges    map[string]*bridge
	retired    []*bridge // removed, sessions still draining
	warnedRuns bool
	shut       bool
}

// New returns a Set with no bridges; Apply starts them.
func New(opts Options) *Set {
	if opts.Clock == nil {
		opts.Clock = clock.Real{}
	}
	if opts.Metrics == nil {
		opts.Metrics = metrics.New()
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.StartupTimeout <= 0 {
		opts.StartupTimeout = 15 * time.Second
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = 10 * time.Second
	}
	if opts.KeepAlive == (net.KeepAliveConfig{}) {
		opts.KeepAlive = net.KeepAliveConfig{Enable: true, Idle: 15 * time.Second, Interval: 5 * time.Second, Count: 3}
	}
	s := &Set{
		opts: opts, clk: opts.Clock, bridges: map[string]*bridge{},
		dialer: net.Dialer{Timeout: opts.DialTimeout, KeepAliveConfig: opts.KeepAlive},
		lc:     listenConfig(opts.KeepAlive),
	}
	s.stopHook = opts.Metrics.OnGather(s.refreshGauges)
	return s
}

// Name is the component's name.
func (s *Set) Name() string { return "bridges" }

func (s *Set) listen(addr string) (net.Listener, error) {
	ln, err := s.lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	return ln, nil
}

// Apply starts, reconfigures and removes bridges to match the policy. A
// bridge whose listener cannot be bound is reported and retried on the next
// reload; the others are applied regardless.
func (s *Set) Apply(_ context.Context, c *governor.Controls) error {
	var cfgs []policy.Bridge
	if c != nil && c.Policy != nil {
		cfgs = c.Policy.Bridges
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shut {
		return errors.New("shut down")
	}
	want := map[string]bool{}
	for _, cfg := range cfgs {
		want[cfg.Name] = true
	}
	// Removals first: they free listen addresses new bridges may take.
	for name, b := range s.bridges {
		if !want[name] {
			b.log.Info("bridge removed from the policy: no new clients; idle sessions close now, the others after their transaction")
			b.retire(causeRemoved)
			delete(s.bridges, name)
			s.retired = append(s.retired, b)
		}
	}
	var errs []error
	s.order = s.order[:0]
	for _, cfg := range cfgs {
		b := s.bridges[cfg.Name]
		if b == nil {
			b = newBridge(s, cfg)
			if err := b.start(cfg); err != nil {
				errs = append(errs, fmt.Errorf("bridge %s: %w", cfg.Name, err))
				continue
			}
			s.bridges[cfg.Name] = b
		} else if err := b.reconfigure(cfg); err != nil {
			errs = append(errs, fmt.Errorf("bridge %s: %w", cfg.Name, err))
		}
		s.order = append(s.order, cfg.Name)
		if cfg.Protocol == protocolPostgres && s.opts.Runs == nil && !s.warnedRuns {
			s.warnedRuns = true
			s.opts.Log.Info("bridge run binding off: no run tracker, so application_name=run:<id> sessions are not bound to runs")
		}
	}
	s.reapRetiredLocked()
	return errors.Join(errs...)
}

// reapRetiredLocked forgets removed bridges whose last client has gone.
func (s *Set) reapRetiredLocked() {
	kept := s.retired[:0]
	for _, b := range s.retired {
		if !b.idleForGood() {
			kept = append(kept, b)
		}
	}
	s.retired = kept
}

// Ready reports the first bridge, in policy order, whose listener is not
// accepting (backing off from an accept error: out of descriptors, say).
func (s *Set) Ready() error {
	for _, b := range s.inOrder() {
		if err := b.ready(); err != nil {
			return fmt.Errorf("bridge %s: %w", b.name, err)
		}
	}
	return nil
}

// StopAccepting closes every bridge's listener at once: new clients are
// refused, while clients already accepted (waiting, or in a session) are
// served until Shutdown drains them. Apply fails afterwards.
func (s *Set) StopAccepting() {
	s.mu.Lock()
	s.shut = true
	all := make([]*bridge, 0, len(s.bridges)) // retired ones stopped accepting when removed
	for _, b := range s.bridges {
		all = append(all, b)
	}
	s.mu.Unlock()
	for _, b := range all {
		b.stopAccepting()
	}
}

// Shutdown stops accepting on every bridge, refuses waiting clients, closes
// idle sessions now and the others after their transaction, and waits for
// them until ctx ends; then it closes what is left.
func (s *Set) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.shut = true
	all := append([]*bridge(nil), s.retired...)
	for _, name := range s.order {
		if b := s.bridges[name]; b != nil {
			all = append(all, b)
		}
	}
	s.bridges, s.retired, s.order = map[string]*bridge{}, nil, nil
	s.mu.Unlock()
	for _, b := range all {
		b.retire(causeShutdown)
	}
	var errs []error
	for _, b := range all {
		if err := b.drained(ctx); err != nil {
			errs = append(errs, fmt.Errorf("bridge %s: sessions cut at the end of shutdown_grace: %w", b.name, err))
		}
	}
	s.stopHook()
	return errors.Join(errs...)
}
