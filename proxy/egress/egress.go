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
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/warden-dev/warden/connpool"
	"github.com/warden-dev/warden/governor"
	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/metrics"
	"github.com/warden-dev/warden/proxy/listener"
	"github.com/warden-dev/warden/proxy/splice"
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

	slot   *listener.Slot
	nofile uint64     // the file limit at start, for the default connection cap
	mu     sync.Mutex // serialises Apply and Shutdown

	tunnels splice.Set
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
	e := &Egress{
		opts:      opts,
		realClock: realClock,
		stats:     stats.NewListener("egress", opts.Metrics),
		pools:     connpool.NewSet(opts.Clock, 0),
		tlsBase:   base,
		nofile:    listener.FileLimit(),
	}
	e.pools.OnUnrequested(e.stats.Unrequested)
	lc := listener.Config{Name: "egress", Metrics: opts.Metrics, Clock: opts.Clock, Log: opts.Log}
	e.slot = listener.NewSlot("egress", opts.Clock, opts.Log, func(addr string, lim listener.Limits) (listener.Server, error) {
		srv := listener.ProxyServer(e.handle, e.refuse, opts.Log)
		srv.ExpectHandler = e.expect
		return listener.Start(addr, srv, lim, lc)
	})
	return e
}

// Name implements the app's Component.
func (e *Egress) Name() string { return "egress" }

// Addr is the bound listen address, "" when stopped.
func (e *Egress) Addr() string { return e.slot.Addr() }

// Ready reports whether the listener serves.
func (e *Egress) Ready() error { return e.slot.Ready(e.table.Load() != nil) }

// Apply starts, reconfigures or stops the HTTP egress for c's policy.
func (e *Egress) Apply(ctx context.Context, c *governor.Controls) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.slot.Err(); err != nil {
		return err
	}
	eg := c.Policy.Egress
	if eg == nil || eg.HTTPListen == "" {
		e.table.Store(nil)
		e.slot.Stop(ctx)
		e.pools.Retain(func(string) bool { return false })
		return nil
	}
	// The slot binds a moved address before build replaces the pools whose
	// settings changed: a reload failing on a taken address keeps them.
	var tb *table
	lim := listener.NewLimits(eg.MaxConnections, eg.Timeouts, c.Policy, e.nofile)
	if err := e.slot.Bind(eg.HTTPListen, lim, func() (err error) { tb, err = e.build(c); return err }); err != nil {
		return err
	}
	tb.self = e.slot.Addr()
	e.table.Store(tb)
	e.pools.Retain(func(k string) bool { return tb.fixedPools[k] })
	return nil
}

// StopAccepting closes the listener at once (new connections are
// refused); what it accepted is served until Shutdown drains it. A reload
// fails afterwards.
func (e *Egress) StopAccepting() { e.slot.StopAccepting() }

// Shutdown stops accepting, lets in-flight requests and open tunnels
// finish until ctx ends (then cuts them), and closes upstream connections.
func (e *Egress) Shutdown(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.slot.Shutdown(ctx, func() error {
		err := e.tunnels.Drain(ctx)
		e.pools.Close()
		return err
	})
}
