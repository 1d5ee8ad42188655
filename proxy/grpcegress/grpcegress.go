// Package grpcegress is warden's gRPC egress (SPEC §5): an h2c listener
// (HTTP/2 without TLS, which fasthttp cannot serve) that forwards each call
// to the target named by the service in its :path — or by its :authority —
// through the same controls as the HTTP egress: tenant cap, circuit
// breaker keyed by the service's target, pools, timeout. Trailers pass
// through, grpc-status is read from them (or from a Trailers-Only
// response), and fast failures are Trailers-Only responses carrying
// x-warden-control.
package grpcegress

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/warden-dev/warden/governor"
	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/metrics"
	"github.com/warden-dev/warden/proxy/listener"
	"github.com/warden-dev/warden/proxy/stats"
)

// Options are the process-wide dependencies of the gRPC egress.
type Options struct {
	Clock   clock.Clock // nil: the real clock
	Metrics *metrics.Metrics
	Log     *slog.Logger
	// TLS is the base client configuration for https upstreams; nil uses
	// the system roots.
	TLS *tls.Config
}

// Grpc is the gRPC egress component. Create it with New.
type Grpc struct {
	opts  Options
	stats *stats.Listener

	table atomic.Pointer[table]

	stallCount prometheus.Counter // request streams ended by body_idle

	slot       *listener.Slot
	nofile     uint64                     // the file limit at start, for the default connection cap
	mu         sync.Mutex                 // serialises Apply and Shutdown
	transports map[string]*http.Transport // by route key, kept across reloads
}

// New returns a stopped gRPC egress; Apply starts it.
func New(opts Options) *Grpc {
	if opts.Clock == nil {
		opts.Clock = clock.Real{}
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.Metrics == nil {
		opts.Metrics = metrics.New()
	}
	g := &Grpc{opts: opts, stats: stats.NewListener("grpc", opts.Metrics), transports: map[string]*http.Transport{},
		nofile:     listener.FileLimit(),
		stallCount: opts.Metrics.ListenerTimeouts.WithLabelValues("grpc", "body_idle")}
	g.slot = listener.NewSlot("grpc egress", opts.Clock, opts.Log, g.startServer)
	return g
}

// startServer serves h2c (HTTP/2 without TLS) on addr. The header and
// idle timeouts are the listener's (lim), kept per connection; a stalled
// request stream is bounded here (bodyIdle).
func (g *Grpc) startServer(addr string, lim listener.Limits) (listener.Server, error) {
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	return listener.StartHTTP(addr, &http.Server{
		Handler:   http.HandlerFunc(g.serve),
		Protocols: &protos,
		ErrorLog:  slog.NewLogLogger(g.opts.Log.Handler(), slog.LevelDebug),
	}, lim, listener.Config{Name: "grpc", Metrics: g.opts.Metrics, Clock: g.opts.Clock, Log: g.opts.Log})
}

// Name implements the app's Component.
func (g *Grpc) Name() string { return "grpc" }

// Addr is the bound listen address, "" when stopped.
func (g *Grpc) Addr() string { return g.slot.Addr() }

// Ready reports whether the listener serves.
func (g *Grpc) Ready() error { return g.slot.Ready(g.table.Load() != nil) }

// Apply starts, reconfigures or stops the gRPC egress for c's policy.
func (g *Grpc) Apply(ctx context.Context, c *governor.Controls) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.slot.Err(); err != nil {
		return err
	}
	eg := c.Policy.Egress
	if eg == nil || eg.GRPCListen == "" {
		g.table.Store(nil)
		err := g.slot.Stop(ctx)
		g.retainTransports(nil)
		return err
	}
	var tb *table
	lim := listener.NewLimits(eg.MaxConnections, eg.Timeouts, c.Policy, g.nofile)
	if err := g.slot.Bind(eg.GRPCListen, lim, func() (err error) { tb, err = g.build(c); return err }); err != nil {
		return err
	}
	tb.self = g.slot.Addr()
	g.table.Store(tb)
	g.retainTransports(tb.transportKeys)
	return nil
}

// retainTransports closes the idle connections of transports no route
// uses any more; calls in flight on them finish.
func (g *Grpc) retainTransports(keep map[string]bool) {
	for k, t := range g.transports {
		if !keep[k] {
			t.CloseIdleConnections()
			delete(g.transports, k)
		}
	}
}

// StopAccepting closes the listener at once (new connections are
// refused); what it accepted is served until Shutdown drains it. A reload
// fails afterwards.
func (g *Grpc) StopAccepting() { g.slot.StopAccepting() }

// Shutdown stops accepting, lets calls in flight finish until ctx ends,
// then cuts them and closes upstream connections.
func (g *Grpc) Shutdown(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.slot.Shutdown(ctx, func() error { g.retainTransports(nil); return nil })
}
