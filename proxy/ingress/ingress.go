// Package ingress is warden's listener in front of the worker (SPEC §5):
// a fasthttp reverse proxy that applies the per-tenant request caps,
// refuses request smuggling, strips hop-by-hop headers, adds x-request-id
// and X-Forwarded-For/-Proto, streams bodies both ways, and serves the
// scheduler's run API (mounted under its path prefix) after the same
// tenant cap.
package ingress

import (
	"context"
	"crypto/tls"
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
	"github.com/warden-dev/warden/proxy/splice"
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

	slot       *listener.Slot
	nofile     uint64     // the file limit at start, for the default connection cap
	mu         sync.Mutex // serialises Apply and Shutdown
	workerURL  string
	workerConf connpool.Config // kept so an unchanged worker keeps its pool

	tunnels splice.Set // connections the worker switched to another protocol
}

// policyState is what one policy decides for the request path, swapped whole
// on reload.
type policyState struct {
	caps         *tenant.Caps
	tenantHeader string
	worker       *connpool.Pool
	timeout      time.Duration // ingress.timeout (0: none)
	target       *stats.Target // the worker's metric children
	mounted      *stats.Target // the run API's metric children
}

type mount struct {
	prefix  string
	h       fasthttp.RequestHandler
	maxBody int
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
	g := &Ingress{
		opts:      opts,
		realClock: realClock,
		ids:       httpwire.NewRequestIDs(),
		stats:     stats.NewListener("ingress", opts.Metrics),
		pools:     connpool.NewSet(opts.Clock, 0),
		nofile:    listener.FileLimit(),
	}
	g.pools.OnUnrequested(g.stats.Unrequested)
	lc := listener.Config{Name: "ingress", Metrics: opts.Metrics, Clock: opts.Clock, Log: opts.Log}
	g.slot = listener.NewSlot("ingress", opts.Clock, opts.Log, func(addr string, lim listener.Limits) (listener.Server, error) {
		srv := listener.ProxyServer(g.handle, g.refuseUnread, opts.Log)
		srv.ExpectHandler = g.expect
		return listener.Start(addr, srv, lim, lc)
	})
	return g
}

// Name implements the app's Component.
func (g *Ingress) Name() string { return "ingress" }

// Mount serves h for requests whose path is prefix or below it
// (prefix + "/..."), after the tenant cap; everything else is proxied to
// the worker. h sees the whole request body through ctx.PostBody(); a body
// over maxBody bytes is answered 400 without reading it all (the mounted
// API's own limit: it is the handler's, so only its owner knows it). Mount
// may be called before or after Apply; an empty prefix or nil h removes
// the mount.
func (g *Ingress) Mount(prefix string, h fasthttp.RequestHandler, maxBody int) {
	if prefix == "" || h == nil {
		g.mount.Store(nil)
		return
	}
	g.mount.Store(&mount{prefix: strings.TrimSuffix(prefix, "/"), h: h, maxBody: maxBody})
}

// Addr is the bound listen address, "" when stopped.
func (g *Ingress) Addr() string { return g.slot.Addr() }

// Ready reports whether the listener serves.
func (g *Ingress) Ready() error { return g.slot.Ready(g.rt.Load() != nil) }

// Apply starts, reconfigures or stops the ingress for c's policy. A moved
// listen address is bound before the worker pool is rebuilt, and the old
// one drained once the reload has succeeded.
func (g *Ingress) Apply(ctx context.Context, c *governor.Controls) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.slot.Err(); err != nil {
		return err
	}
	in := c.Policy.Ingress
	if in == nil {
		g.rt.Store(nil)
		g.slot.Stop(ctx)
		g.pools.Retain(func(string) bool { return false })
		return nil
	}
	var rt *policyState
	lim := listener.NewLimits(in.MaxConnections, in.Timeouts, c.Policy, g.nofile)
	if err := g.slot.Bind(in.Listen, lim, func() (err error) { rt, err = g.build(c); return err }); err != nil {
		return err
	}
	g.rt.Store(rt)
	g.pools.Retain(func(k string) bool { return k == "worker" })
	return nil
}

// build returns the request path's state for c's ingress.
func (g *Ingress) build(c *governor.Controls) (*policyState, error) {
	worker, err := g.workerPool(c.Policy.Ingress.Worker)
	if err != nil {
		return nil, err
	}
	rt := &policyState{
		caps:    c.IngressCaps,
		worker:  worker,
		timeout: c.Policy.Ingress.Timeout,
		target:  g.stats.Target("worker"),
		mounted: g.stats.Target("scheduler"),
	}
	if rt.caps != nil {
		rt.tenantHeader = strings.ToLower(rt.caps.Header())
	}
	return rt, nil
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

// StopAccepting closes the listener at once (new connections are
// refused); what it accepted is served until Shutdown drains it. A reload
// fails afterwards.
func (g *Ingress) StopAccepting() { g.slot.StopAccepting() }

// Shutdown stops accepting, lets in-flight requests finish until ctx
// ends, then closes the worker connections.
func (g *Ingress) Shutdown(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.slot.Shutdown(ctx, func() error {
		err := g.tunnels.Drain(ctx)
		g.pools.Close()
		return err
	})
}
