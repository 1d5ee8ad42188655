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
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

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

	drains      sync.WaitGroup // servers of replaced listeners still draining
	drainCtx    context.Context
	cancelDrain context.CancelFunc
	mu          sync.Mutex // serialises Apply and Shutdown
	srv         *http.Server
	ln          net.Listener
	addr        string
	done        chan struct{}
	shutdown    bool
	transports  map[string]*http.Transport // by route key, kept across reloads
}

// New returns a stopped gRPC egress; Apply starts it.
func New(opts Options) *Grpc {
	if opts.Clock == nil {
		opts.Clock = clock.Real{}
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	drainCtx, cancel := context.WithCancel(context.Background())
	return &Grpc{opts: opts, stats: stats.NewListener("grpc", opts.Metrics), transports: map[string]*http.Transport{},
		drainCtx: drainCtx, cancelDrain: cancel}
}

// Name implements the app's Component.
func (g *Grpc) Name() string { return "grpc" }

// Addr is the bound listen address, "" when stopped.
func (g *Grpc) Addr() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ln == nil {
		return ""
	}
	return g.ln.Addr().String()
}

// Ready reports whether the listener serves.
func (g *Grpc) Ready() error {
	if g.table.Load() != nil && g.Addr() == "" {
		return errors.New("grpc listener not bound")
	}
	return nil
}

// Apply starts, reconfigures or stops the gRPC egress for c's policy.
func (g *Grpc) Apply(ctx context.Context, c *governor.Controls) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shutdown {
		return errors.New("grpc egress is shut down")
	}
	eg := c.Policy.Egress
	if eg == nil || eg.GRPCListen == "" {
		g.table.Store(nil)
		err := g.stopLocked(ctx)
		g.retainTransports(nil)
		return err
	}
	tb, err := g.build(c)
	if err != nil {
		return err
	}
	if g.ln == nil || g.addr != eg.GRPCListen {
		ln, err := net.Listen("tcp", eg.GRPCListen)
		if err != nil {
			return fmt.Errorf("grpc egress: listen on %s: %w", eg.GRPCListen, err)
		}
		var protos http.Protocols
		protos.SetUnencryptedHTTP2(true)
		srv := &http.Server{
			Handler:           http.HandlerFunc(g.serve),
			Protocols:         &protos,
			ReadHeaderTimeout: 10 * time.Second,
			ErrorLog:          slog.NewLogLogger(g.opts.Log.Handler(), slog.LevelDebug),
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				g.opts.Log.Error("grpc egress stopped", "err", err)
			}
		}()
		oldSrv, oldDone := g.srv, g.done
		g.srv, g.ln, g.addr, g.done = srv, ln, eg.GRPCListen, done
		if oldSrv != nil {
			// Drained in the background with a bounded grace, so a reload
			// never waits for long calls; Shutdown waits for it.
			g.drains.Add(1)
			go func() {
				defer g.drains.Done()
				ctx, cancel := context.WithTimeout(g.drainCtx, 30*time.Second)
				defer cancel()
				_ = stopServer(ctx, oldSrv, oldDone)
			}()
		}
	}
	tb.self = g.ln.Addr().String()
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

func (g *Grpc) stopLocked(ctx context.Context) error {
	if g.srv == nil {
		return nil
	}
	srv, done := g.srv, g.done
	g.srv, g.ln, g.addr, g.done = nil, nil, "", nil
	return stopServer(ctx, srv, done)
}

// stopServer stops srv accepting, lets its calls finish until ctx ends,
// then cuts what is left, and waits for its Serve (which closes done) to
// return.
func stopServer(ctx context.Context, srv *http.Server, done <-chan struct{}) error {
	err := srv.Shutdown(ctx)
	if err != nil {
		srv.Close()
	}
	<-done
	return err
}

// Shutdown stops accepting, lets calls in flight finish until ctx ends,
// then cuts them and closes upstream connections.
func (g *Grpc) Shutdown(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shutdown {
		return nil
	}
	g.shutdown = true
	err := g.stopLocked(ctx)
	listener.WaitDrains(ctx, &g.drains, g.cancelDrain)
	g.retainTransports(nil)
	return err
}
