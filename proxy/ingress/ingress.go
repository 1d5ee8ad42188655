// Package ingress is warden's listener in front of the worker (SPEC §5):
// a fasthttp reverse proxy that applies the per-tenant request caps,
// refuses request smuggling, strips hop-by-hop headers, adds x-request-id,
// streams bodies both ways, and serves the scheduler's run API (mounted
// under its path prefix) after the same tenant cap.
package ingress

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warden-dev/warden/connpool"
	"github.com/warden-dev/warden/governor"
	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/metrics"
	"github.com/warden-dev/warden/governor/tenant"
	"github.com/warden-dev/warden/proxy/httpwire"
	"github.com/warden-dev/warden/proxy/listener"
	"github.com/warden-dev/warden/proxy/stats"
)

// Options are the process-wide dependencies of the ingress.
type Options struct {
	Clock   clock.Clock // nil: the real clock
	Metrics *metrics.Metrics
	Log     *slog.Logger
	// TLS is the base client configuration for an https worker; nil uses
	// the system roots. Tests set their own CA here.
	TLS *tls.Config
}

// workerIdleTimeout closes pooled worker connections idle this long.
const workerIdleTimeout = 90 * time.Second

// Ingress is the component. The zero value is not usable; call New.
type Ingress struct {
	opts      Options
	realClock bool
	ids       *httpwire.RequestIDs
	stats     *stats.Listener
	pools     *connpool.Set

	rt    atomic.Pointer[policyState]
	mount atomic.Pointer[mount]

	drains      sync.WaitGroup // replaced listeners still draining
	drainCtx    context.Context
	cancelDrain context.CancelFunc
	mu          sync.Mutex // serialises Apply and Shutdown
	ln          *listener.Listener
	addr        string
	shutdown    bool
	workerURL   string
	workerConf  connpool.Config // kept so an unchanged worker keeps its pool
}

// policyState is what one policy decides for the request path, swapped whole
// on reload.
type policyState struct {
	caps         *tenant.Caps
	tenantHeader string
	worker       *connpool.Pool
	target       *stats.Target // the worker's metric children
	mounted      *stats.Target // the run API's metric children
}

type mount struct {
	prefix string
	h      fasthttp.RequestHandler
}

// New returns a stopped ingress; Apply starts it.
func New(opts Options) *Ingress {
	if opts.Clock == nil {
		opts.Clock = clock.Real{}
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	_, realClock := opts.Clock.(clock.Real)
	drainCtx, cancel := context.WithCancel(context.Background())
	return &Ingress{
		drainCtx:    drainCtx,
		cancelDrain: cancel,
		opts:        opts,
		realClock:   realClock,
		ids:         httpwire.NewRequestIDs(),
		stats:       stats.NewListener("ingress", opts.Metrics),
		pools:       connpool.NewSet(opts.Clock, 0),
	}
}

// Name implements the app's Component.
func (g *Ingress) Name() string { return "ingress" }

// Mount serves h for requests whose path is prefix or below it
// (prefix + "/..."), after the tenant cap; everything else is proxied to
// the worker. h sees the whole request body (up to MountBodyLimit) through
// ctx.PostBody(). Mount may be called before or after Apply; an empty
// prefix or nil h removes the mount.
func (g *Ingress) Mount(prefix string, h fasthttp.RequestHandler) {
	if prefix == "" || h == nil {
		g.mount.Store(nil)
		return
	}
	g.mount.Store(&mount{prefix: strings.TrimSuffix(prefix, "/"), h: h})
}

// Addr is the bound listen address, "" when stopped.
func (g *Ingress) Addr() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ln == nil {
		return ""
	}
	return g.ln.Addr().String()
}

// Ready reports whether the listener serves.
func (g *Ingress) Ready() error {
	if g.Addr() == "" && g.rt.Load() != nil {
		return errors.New("ingress listener not bound")
	}
	return nil
}

// Apply starts, reconfigures or stops the ingress for c's policy. A moved
// listen address binds the new one before the old one is drained.
func (g *Ingress) Apply(ctx context.Context, c *governor.Controls) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shutdown {
		return errors.New("ingress is shut down")
	}
	in := c.Policy.Ingress
	if in == nil {
		g.rt.Store(nil)
		g.stopLocked(ctx)
		g.pools.Retain(func(string) bool { return false })
		return nil
	}
	worker, err := g.workerPool(in.Worker)
	if err != nil {
		return err
	}
	rt := &policyState{
		caps:    c.IngressCaps,
		worker:  worker,
		target:  g.stats.Target("worker"),
		mounted: g.stats.Target("scheduler"),
	}
	if rt.caps != nil {
		rt.tenantHeader = strings.ToLower(rt.caps.Header())
	}
	if g.ln == nil || g.addr != in.Listen {
		ln, err := listener.Start(in.Listen, listener.ProxyServer(g.serve, g.opts.Log), g.opts.Log)
		if err != nil {
			return fmt.Errorf("ingress: %w", err)
		}
		old := g.ln
		g.ln, g.addr = ln, in.Listen
		if old != nil {
			g.drains.Add(1)
			go func() { defer g.drains.Done(); drain(g.drainCtx, old, g.opts.Log) }()
		}
	}
	g.rt.Store(rt)
	g.pools.Retain(func(k string) bool { return k == "worker" })
	return nil
}

// drain shuts a replaced listener down in the background with a bounded
// grace, so a reload never waits for long requests; Shutdown waits for it.
func drain(parent context.Context, ln *listener.Listener, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(parent, 30*time.Second)
	defer cancel()
	if err := ln.Shutdown(ctx); err != nil {
		log.Warn("ingress: old listener drained with errors", "err", err)
	}
}

func (g *Ingress) workerPool(worker string) (*connpool.Pool, error) {
	if worker == g.workerURL {
		return g.pools.Pool("worker", g.workerConf), nil
	}
	u, err := url.Parse(worker)
	if err != nil {
		return nil, fmt.Errorf("ingress.worker %q: %w", worker, err)
	}
	cfg := connpool.Config{Addr: u.Host, IdleTimeout: workerIdleTimeout}
	if u.Port() == "" {
		cfg.Addr += map[bool]string{true: ":443", false: ":80"}[u.Scheme == "https"]
	}
	if u.Scheme == "https" {
		tc := &tls.Config{}
		if g.opts.TLS != nil {
			tc = g.opts.TLS.Clone()
		}
		tc.ServerName = u.Hostname()
		cfg.TLS = tc
	}
	g.workerURL, g.workerConf = worker, cfg
	return g.pools.Pool("worker", cfg), nil
}

func (g *Ingress) stopLocked(ctx context.Context) error {
	if g.ln == nil {
		return nil
	}
	ln := g.ln
	g.ln, g.addr = nil, ""
	return ln.Shutdown(ctx)
}

// Shutdown stops accepting, lets in-flight requests finish until ctx
// ends, then closes the worker connections.
func (g *Ingress) Shutdown(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shutdown {
		return nil
	}
	g.shutdown = true
	err := g.stopLocked(ctx)
	listener.WaitDrains(ctx, &g.drains, g.cancelDrain)
	g.pools.Close()
	return err
}
