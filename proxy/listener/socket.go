package listener

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/metrics"
	"github.com/warden-dev/warden/internal/accept"
)

// Config is what a listener needs besides its server and its limits.
type Config struct {
	// Name labels the listener's metrics and log lines: "ingress",
	// "egress", "grpc".
	Name    string
	Metrics *metrics.Metrics // nil: counted in a set nobody reads
	Clock   clock.Clock      // times the backoffs; nil: the real clock
	Log     *slog.Logger     // nil: discarded
}

// socket is a bound address and the loop that serves it: a server whose
// Serve ends while nobody closed the socket is started again on it.
type socket struct {
	g    *gate
	cfg  Config
	done chan struct{} // closed when the loop has returned
	down atomic.Pointer[error]

	restarts prometheus.Counter
}

// listen binds addr behind a gate with lim; raw says whether the
// connections are a fasthttp server's (see gate).
func listen(addr string, raw bool, lim Limits, cfg Config) (*socket, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	return newSocket(ln, raw, lim, cfg), nil
}

func newSocket(ln net.Listener, raw bool, lim Limits, cfg Config) *socket {
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New()
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	g := &gate{
		Listener: accept.New(ln, accept.Options{
			Name: cfg.Name, Clock: cfg.Clock, Log: cfg.Log,
			Errors: cfg.Metrics.ListenerAcceptErrors.WithLabelValues(cfg.Name),
		}),
		name: cfg.Name, raw: raw, log: cfg.Log,
		m: newGateMetrics(cfg.Metrics, cfg.Name),
	}
	g.setLimits(lim)
	return &socket{g: g, cfg: cfg, done: make(chan struct{}),
		restarts: cfg.Metrics.ListenerRestarts.WithLabelValues(cfg.Name)}
}

// serve runs serveOn on the socket in a goroutine until the socket is
// closed (StopAccepting, Shutdown). serveOn returning before that is a
// failure: it is logged, counted, and serveOn runs again after a backoff,
// during which Accepting reports it.
func (s *socket) serve(serveOn func(net.Listener) error) {
	go func() {
		defer close(s.done)
		backoff := time.Duration(0)
		for {
			began := s.cfg.Clock.Now()
			err := serveOn(s.g)
			if s.g.Closed() {
				return
			}
			if err == nil {
				err = errors.New("returned without an error")
			}
			if s.cfg.Clock.Now().Sub(began) > time.Minute {
				backoff = 0 // it served a while: not the same failure again
			}
			backoff = accept.Backoff(backoff)
			down := fmt.Errorf("server stopped accepting (%w); restarting it", err)
			s.down.Store(&down)
			s.restarts.Inc()
			s.cfg.Log.Error("listener stopped unexpectedly: restarting it on the same socket", "listener", s.cfg.Name,
				"addr", s.Addr().String(), "err", err, "retry_in", backoff)
			t := s.cfg.Clock.NewTimer(backoff)
			select {
			case <-t.C():
			case <-s.g.Done():
				t.Stop()
				return
			}
			s.down.Store(nil)
		}
	}()
}

// Addr is the bound address (useful with port 0).
func (s *socket) Addr() net.Addr { return s.g.Addr() }

// StopAccepting closes the listening socket: new connections are refused
// from now on, while the connections already accepted are served until
// Shutdown drains them.
func (s *socket) StopAccepting() { _ = s.g.Close() }

// SetLimits applies lim: its cap at once, its timeouts to the connections
// accepted from now on.
func (s *socket) SetLimits(lim Limits) { s.g.setLimits(lim) }

// Accepting is nil while the listener accepts connections; otherwise why
// it does not: the accept error it is backing off from, or its server
// ended and is being restarted.
func (s *socket) Accepting() error {
	if s.g.Closed() {
		return errors.New("listener closed")
	}
	if err := s.g.Err(); err != nil {
		return err
	}
	if down := s.down.Load(); down != nil {
		return *down
	}
	return nil
}
