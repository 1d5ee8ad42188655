// Package rls serves Envoy's RateLimitService v3 (envoy.service.ratelimit.v3)
// on rls.listen: the descriptor limits of rls.domains, counted in the same
// fixed windows as the rest of warden (memory or Redis), plus the standard
// gRPC health service. See README.md.
package rls

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/warden-dev/warden/governor"
	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/control"
	"github.com/warden-dev/warden/governor/metrics"
	"github.com/warden-dev/warden/governor/window"
)

// listenerLabel is the listener label of the RLS's request metrics.
const listenerLabel = "rls"

// Server is the RLS component: Apply starts, reconfigures or stops it.
type Server struct {
	rlspb.UnimplementedRateLimitServiceServer

	counter window.Counter
	clk     clock.Clock
	m       *metrics.Metrics
	log     *slog.Logger
	cfg     atomic.Pointer[config] // nil: no rls section
	maxKeys int                    // MaxKeys; lowered by tests

	mu   sync.Mutex // guards the listener below
	addr string     // configured rls.listen of the running listener
	ln   net.Listener
	srv  *grpc.Server
	hs   *health.Server
	wg   sync.WaitGroup
}

// New returns a stopped RLS counting in counter.
func New(counter window.Counter, clk clock.Clock, m *metrics.Metrics, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{counter: counter, clk: clk, m: m, log: log.With("component", "rls"), maxKeys: MaxKeys}
}

// Name implements app.Component.
func (s *Server) Name() string { return "rls" }

// Apply starts the listener, swaps in the reloaded domains, moves the
// listener when rls.listen changed (the new one is bound before the old one
// drains, so a bad address keeps the old listener), or stops it when the
// section is gone.
func (s *Server) Apply(ctx context.Context, c *governor.Controls) error {
	p := c.Policy.RLS
	if p == nil {
		s.cfg.Store(nil)
		return s.stop(ctx)
	}
	s.cfg.Store(compile(p, s.m, s.maxKeys))
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil && s.addr == p.Listen {
		return nil
	}
	ln, err := net.Listen("tcp", p.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", p.Listen, err)
	}
	old, oldHS := s.srv, s.hs
	s.srv, s.hs, s.ln, s.addr = s.newGRPC(), health.NewServer(), ln, p.Listen
	healthpb.RegisterHealthServer(s.srv, s.hs)
	s.hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.hs.SetServingStatus(rlspb.RateLimitService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	srv := s.srv
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		// A listener closed by StopAccepting ends Serve with the accept
		// error; the drain follows in Shutdown.
		if err := srv.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) && !errors.Is(err, net.ErrClosed) {
			s.log.Error("rls listener stopped", "err", err)
		}
	}()
	s.log.Info("rls listening", "addr", ln.Addr().String(), "domains", len(p.Domains))
	if old != nil {
		oldHS.Shutdown()
		drain(ctx, old)
	}
	return nil
}

// streamWorkers is how many goroutines serve calls. A call that finds none
// free gets a goroutine of its own (grpc-go's fallback), which grows a
// fresh stack. Workers beyond the calls in flight sit idle most of the
// time, and the garbage collector shrinks an idle worker's stack, which its
// next call grows again: with 256 workers for 64 calls in flight that churn cost
// more than the fallback saves. 64 cut the RLS's CPU per call by about a
// fifth with Redis windows (bench-rls; measured when the value was chosen, in git history).
const streamWorkers = 64

// ioBuffer is the read and write buffer of each connection: a burst of
// answers (a batch of Redis decisions ends together) goes out in fewer
// writes. The write buffer is shared between connections' flushes
// (grpc.SharedWriteBuffer), so idle connections hold none.
const ioBuffer = 64 << 10

func (s *Server) newGRPC() *grpc.Server {
	srv := grpc.NewServer(grpc.NumStreamWorkers(streamWorkers), grpc.SharedWriteBuffer(true),
		grpc.ReadBufferSize(ioBuffer), grpc.WriteBufferSize(ioBuffer))
	rlspb.RegisterRateLimitServiceServer(srv, s)
	return srv
}

// StopAccepting closes the listener at once and turns the health service
// to NOT_SERVING; calls on connections already open are answered until
// Shutdown drains them.
func (s *Server) StopAccepting() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv == nil {
		return
	}
	s.hs.Shutdown()
	// GracefulStop closes it again later, ignoring the error.
	_ = s.ln.Close()
}

// Shutdown implements app.Component: the health service reports
// NOT_SERVING, in-flight calls finish within ctx.
func (s *Server) Shutdown(ctx context.Context) error { return s.stop(ctx) }

func (s *Server) stop(ctx context.Context) error {
	s.mu.Lock()
	srv, hs := s.srv, s.hs
	s.srv, s.hs, s.ln, s.addr = nil, nil, nil, ""
	s.mu.Unlock()
	if srv != nil {
		hs.Shutdown()
		drain(ctx, srv)
	}
	s.wg.Wait()
	return nil
}

// drainTimeout bounds a graceful stop. RLS calls are unary and take
// milliseconds; what outlives this is a health Watch stream, which never
// ends by itself and must not hold a reload or a shutdown.
const drainTimeout = 2 * time.Second

// drain stops srv gracefully, or at once when ctx or drainTimeout ends
// first.
func drain(ctx context.Context, srv *grpc.Server) {
	ctx, cancel := context.WithTimeout(ctx, drainTimeout)
	defer cancel()
	done := make(chan struct{})
	go func() {
		srv.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		srv.Stop()
		<-done
	}
}

// Addr is the bound address of the listener, "" when stopped.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// Ready implements the admin API's readiness: configured means listening.
func (s *Server) Ready() error {
	if s.cfg.Load() == nil {
		return nil
	}
	if s.Addr() == "" {
		return errors.New("listener not bound")
	}
	return nil
}

// ShouldRateLimit implements envoy.service.ratelimit.v3.RateLimitService.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	start := time.Now() // wall-clock latency for the metric; decisions use s.clk
	cfg := s.cfg.Load()
	if cfg == nil {
		return nil, errNotConfigured
	}
	out, err := decide(cfg, s.counter, req, s.clk.Now())
	if err != nil {
		return nil, err
	}
	if m := out.m; m != nil {
		switch out.control {
		case "":
			m.ok.Inc()
		case control.Upstream:
			m.over.Inc()
			m.upstr.Inc()
		default:
			m.over.Inc()
			m.limited.Inc()
		}
		if out.overflowed {
			m.overflow.Inc()
		}
		m.duration.Observe(time.Since(start).Seconds())
	}
	return out.resp, nil
}

var errNotConfigured = status.Error(codes.Unavailable, "warden: rls is not configured")
