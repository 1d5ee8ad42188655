// Package egress is warden's outbound HTTP proxy for the worker (SPEC §5):
// absolute-form requests (HTTP_PROXY), origin-form requests whose Host
// names a target, and CONNECT tunnels, each run through its target's
// controls — tenant cap, circuit breaker, pools, retries within the
// budget, a timeout over the whole exchange — on pooled upstream
// connections, with TLS origination for https upstreams.
package egress

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warden-dev/warden/connpool"
	"github.com/warden-dev/warden/governor"
	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/metrics"
	"github.com/warden-dev/warden/proxy/listener"
	"github.com/warden-dev/warden/proxy/stats"
)

// Options are the process-wide dependencies of the egress.
type Options struct {
	Clock   clock.Clock // nil: the real clock
	Metrics *metrics.Metrics
	Log     *slog.Logger
	// TLS is the base client configuration for TLS origination; nil uses
	// the system roots. Tests set their own CA here.
	TLS *tls.Config
}

// Egress is the HTTP egress component. Create it with New.
type Egress struct {
	opts      Options
	realClock bool
	stats     *stats.Listener
	pools     *connpool.Set
	tlsBase   *tls.Config

	table atomic.Pointer[table]

	drains      sync.WaitGroup // replaced listeners still draining
	drainCtx    context.Context
	cancelDrain context.CancelFunc
	mu          sync.Mutex // serialises Apply and Shutdown
	ln          *listener.Listener
	addr        string
	shutdown    bool

	tunnels tunnels
}

// New returns a stopped egress; Apply starts it.
func New(opts Options) *Egress {
	if opts.Clock == nil {
		opts.Clock = clock.Real{}
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	_, realClock := opts.Clock.(clock.Real)
	base := opts.TLS
	if base == nil {
		base = &tls.Config{}
	}
	drainCtx, cancel := context.WithCancel(context.Background())
	return &Egress{
		drainCtx:    drainCtx,
		cancelDrain: cancel,
		opts:        opts,
		realClock:   realClock,
		stats:       stats.NewListener("egress", opts.Metrics),
		pools:       connpool.NewSet(opts.Clock, 0),
		tlsBase:     base,
		tunnels:     tunnels{open: map[*tunnel]struct{}{}},
	}
}

// Name implements the app's Component.
func (e *Egress) Name() string { return "egress" }

// Addr is the bound listen address, "" when stopped.
func (e *Egress) Addr() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ln == nil {
		return ""
	}
	return e.ln.Addr().String()
}

// Ready reports whether the listener serves.
func (e *Egress) Ready() error {
	if e.table.Load() != nil && e.Addr() == "" {
		return errors.New("egress listener not bound")
	}
	return nil
}

// Apply starts, reconfigures or stops the HTTP egress for c's policy.
func (e *Egress) Apply(ctx context.Context, c *governor.Controls) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.shutdown {
		return errors.New("egress is shut down")
	}
	eg := c.Policy.Egress
	if eg == nil || eg.HTTPListen == "" {
		e.table.Store(nil)
		e.stopLocked(ctx)
		e.pools.Retain(func(string) bool { return false })
		return nil
	}
	// Bind before building: building replaces connection pools whose
	// settings changed, which must not happen for a reload that then fails
	// because the new address is taken. Until the table below is stored
	// the new listener serves with the current one.
	var ln *listener.Listener
	if e.ln == nil || e.addr != eg.HTTPListen {
		var err error
		if ln, err = listener.Start(eg.HTTPListen, listener.ProxyServer(e.serve, e.opts.Log), e.opts.Log); err != nil {
			return fmt.Errorf("egress: %w", err)
		}
	}
	tb, err := e.build(c)
	if err != nil {
		if ln != nil {
			e.drains.Add(1)
			go func() { defer e.drains.Done(); drain(e.drainCtx, ln, e.opts.Log) }()
		}
		return err
	}
	if ln != nil {
		old := e.ln
		e.ln, e.addr = ln, eg.HTTPListen
		if old != nil {
			e.drains.Add(1)
			go func() { defer e.drains.Done(); drain(e.drainCtx, old, e.opts.Log) }()
		}
	}
	tb.self = e.ln.Addr().String()
	e.table.Store(tb)
	e.pools.Retain(func(k string) bool { return tb.fixedPools[k] })
	return nil
}

func drain(parent context.Context, ln *listener.Listener, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(parent, 30*time.Second)
	defer cancel()
	if err := ln.Shutdown(ctx); err != nil {
		log.Warn("egress: old listener drained with errors", "err", err)
	}
}

func (e *Egress) stopLocked(ctx context.Context) error {
	if e.ln == nil {
		return nil
	}
	ln := e.ln
	e.ln, e.addr = nil, ""
	return ln.Shutdown(ctx)
}

// Shutdown stops accepting, lets in-flight requests and open tunnels
// finish until ctx ends (then cuts them), and closes upstream connections.
func (e *Egress) Shutdown(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.shutdown {
		return nil
	}
	e.shutdown = true
	err := e.stopLocked(ctx)
	listener.WaitDrains(ctx, &e.drains, e.cancelDrain)
	if terr := e.tunnels.drain(ctx); err == nil {
		err = terr
	}
	e.pools.Close()
	return err
}
