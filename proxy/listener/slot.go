package listener

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/warden-dev/warden/governor/clock"
)

// Server is a server started on one address: a *Listener (fasthttp) or an
// *HTTP (net/http).
type Server interface {
	Addr() net.Addr
	// StopAccepting closes the listening socket at once; the connections
	// already accepted are served until Shutdown.
	StopAccepting()
	// Shutdown stops accepting, lets in-flight requests finish until ctx
	// ends, then cuts what is left; it returns once the server is gone.
	Shutdown(ctx context.Context) error
	// SetLimits applies a reload's limits without rebinding: the cap at
	// once, the timeouts to connections accepted from then on.
	SetLimits(Limits)
	// Accepting is nil while the server accepts connections, else why it
	// does not (backing off from an accept error, restarting).
	Accepting() error
}

// StartFunc starts a component's server on addr under lim. The Server is
// not used when the error is non-nil, so a typed nil pointer may be
// returned with it.
type StartFunc func(addr string, lim Limits) (Server, error)

// DrainGrace bounds how long a listener a reload moved away from keeps
// serving what it has in flight, so long requests cannot pin it forever.
const DrainGrace = 30 * time.Second

// Slot is the listener of one proxy component across reloads: the current
// server, the address it was started for, and the background drains of the
// servers that reloads replaced. Its methods are safe for concurrent use:
// Bind's build runs under the slot's lock, so it must not call the slot
// (Addr waits meanwhile); Shutdown drains without the lock, so Addr, Ready
// and Err answer at once during a drain.
type Slot struct {
	name  string // prefixes log lines; errors leave naming the component to the caller
	start StartFunc
	clk   clock.Clock
	log   *slog.Logger

	drains      sync.WaitGroup // replaced servers still draining
	drainCtx    context.Context
	cancelDrain context.CancelFunc

	mu     sync.Mutex
	cur    Server
	addr   string // as configured, so "127.0.0.1:0" stays bound across reloads
	closed bool   // StopAccepting or Shutdown was called: Bind fails
	shut   bool   // Shutdown was called
}

// NewSlot returns an empty slot: start starts its servers, clk times the
// drains of replaced ones, name prefixes its log lines. Errors do not
// start with name: the app puts the component's name before them.
func NewSlot(name string, clk clock.Clock, log *slog.Logger, start StartFunc) *Slot {
	drainCtx, cancel := context.WithCancel(context.Background())
	return &Slot{name: name, start: start, clk: clk, log: log, drainCtx: drainCtx, cancelDrain: cancel}
}

// Addr is the bound address of the current server, "" when there is none.
func (s *Slot) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil {
		return ""
	}
	return s.cur.Addr().String()
}

// Err is non-nil once Shutdown has been called: what a reload reports
// then.
func (s *Slot) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.errLocked()
}

func (s *Slot) errLocked() error {
	if s.closed {
		return errors.New("listener is shut down")
	}
	return nil
}

// Ready reports an error when the component is configured to serve but no
// server is bound, or when its server is not accepting connections
// ("listener 0.0.0.0:8080 not accepting: accept4: too many open files").
func (s *Slot) Ready(configured bool) error {
	s.mu.Lock()
	cur := s.cur
	s.mu.Unlock()
	if cur == nil {
		if configured {
			return errors.New("listener not bound")
		}
		return nil
	}
	if err := cur.Accepting(); err != nil {
		return fmt.Errorf("listener %s not accepting: %w", cur.Addr(), err)
	}
	return nil
}

// Bind makes addr the slot's address, with limits lim, and runs build, the
// component's reload. A new address is bound before build runs: build
// replaces resources (connection pools) the running configuration still
// uses, which must not happen for a reload that then fails because the
// address is taken. If build fails, the new server is drained and the
// current one keeps serving under its limits; otherwise the new server
// becomes current and the old one drains in the background (until then
// both serve, with whatever handler state the component has), or the
// current one, when the address stays, takes lim.
func (s *Slot) Bind(addr string, lim Limits, build func() error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.errLocked(); err != nil {
		return err
	}
	var next Server
	if s.cur == nil || s.addr != addr {
		srv, err := s.start(addr, lim)
		if err != nil {
			return err
		}
		next = srv
	}
	if err := build(); err != nil {
		if next != nil {
			s.drainInBackground(next)
		}
		return err
	}
	if next == nil {
		s.cur.SetLimits(lim)
		return nil
	}
	if s.cur != nil {
		s.drainInBackground(s.cur)
	}
	s.cur, s.addr = next, addr
	return nil
}

// drainInBackground shuts srv down with a bounded grace, so a reload never
// waits for long requests; Shutdown waits for it.
func (s *Slot) drainInBackground(srv Server) {
	s.drains.Add(1)
	go func() {
		defer s.drains.Done()
		ctx, cancel := context.WithCancel(s.drainCtx)
		defer cancel()
		t := s.clk.AfterFunc(DrainGrace, cancel)
		defer t.Stop()
		if err := srv.Shutdown(ctx); err != nil {
			s.log.Warn(s.name+": listener drained in the background with errors", "addr", srv.Addr().String(), "err", err)
		}
	}()
}

// Stop shuts the current server down (in-flight requests finish until ctx
// ends); the slot is empty afterwards and a later Bind starts a new one.
func (s *Slot) Stop(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopLocked(ctx)
}

func (s *Slot) stopLocked(ctx context.Context) error {
	if s.cur == nil {
		return nil
	}
	srv := s.cur
	s.cur, s.addr = nil, ""
	return srv.Shutdown(ctx)
}

// StopAccepting closes the current server's listening socket, so that a
// process shutting down refuses new connections on every listener at once
// while each component's Shutdown drains what it has accepted. Servers a
// reload replaced stopped accepting when they were replaced. Bind fails
// afterwards: a reload must not open a new listener during the drain.
func (s *Slot) StopAccepting() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.cur != nil {
		s.cur.StopAccepting()
	}
}

// Retire empties the slot like Stop, but drains the server in the
// background for at most DrainGrace, as Bind does with a replaced one: for
// a listener that may be serving the very request that removes it (the
// admin API's POST /v1/policy/reload), which Stop would wait for.
func (s *Slot) Retire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil {
		return
	}
	s.drainInBackground(s.cur)
	s.cur, s.addr = nil, ""
}

// Shutdown stops the current server, waits for the background drains of
// replaced ones until ctx ends, then cuts them, and then runs release (the
// component frees what its requests used, now that none is left). The
// first error is returned. Only the first call does anything; Bind fails
// afterwards. The slot is empty from the start of the drain (Addr is "").
func (s *Slot) Shutdown(ctx context.Context, release func() error) error {
	s.mu.Lock()
	if s.shut {
		s.mu.Unlock()
		return nil
	}
	s.closed, s.shut = true, true
	srv := s.cur
	s.cur, s.addr = nil, ""
	s.mu.Unlock()
	var err error
	if srv != nil {
		err = srv.Shutdown(ctx)
	}
	// No drain can start any more (Bind fails), so the wait group only
	// goes down.
	waitDrains(ctx, &s.drains, s.cancelDrain)
	if rerr := release(); err == nil {
		err = rerr
	}
	return err
}
