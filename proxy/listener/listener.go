// Package listener runs one server on one address for a proxy component
// (fasthttp: Start; net/http: StartHTTP), and drains it: StopAccepting
// closes its socket at once, Shutdown stops accepting, lets in-flight
// requests finish until the context's deadline, then closes whatever is
// left. Hijacked connections (CONNECT tunnels) are the hijacker's to
// track. A Slot keeps a component's server across reloads: it binds a
// moved address, drains the replaced server in the background, and waits
// for those drains on shutdown.
//
// The socket is kept accepting through temporary errors (internal/accept),
// and a server that stops anyway is started again on it; connections over
// the listener's cap are closed as they come; the slow-client timeouts are
// kept per connection (conn, httpConn). See README.md.
package listener

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// Listener is a fasthttp server bound to one address.
type Listener struct {
	*socket
	srv *fasthttp.Server

	mu    sync.Mutex
	conns map[net.Conn]struct{} // every connection the server holds
}

// Start listens on addr and serves srv there under lim. srv.ConnState is
// taken over to track connections, and the read timeouts to keep them
// per connection (conn).
func Start(addr string, srv *fasthttp.Server, lim Limits, cfg Config) (*Listener, error) {
	s, err := listen(addr, true, lim, cfg)
	if err != nil {
		return nil, err
	}
	return startOn(s, srv), nil
}

func startOn(s *socket, srv *fasthttp.Server) *Listener {
	l := &Listener{socket: s, srv: srv, conns: map[net.Conn]struct{}{}}
	srv.ConnState = l.connState
	srv.CloseOnShutdown = true
	// The connection keeps the header and idle timeouts (conn), so the
	// server sets no read deadline but the one HeaderReceived asks for, at
	// the end of each request's head: that call starts the body's timeout.
	// Its duration is not used.
	//
	// fasthttp reads up to min(MaxRequestBodySize, 8 KiB) of a body
	// before it calls the handler, and streams the rest either way: one
	// byte hands the body over to the handler, and to its deadlines (a
	// target's timeout), as soon as it begins.
	srv.ReadTimeout, srv.IdleTimeout = 0, 0
	srv.HeaderReceived = func(*fasthttp.RequestHeader) fasthttp.RequestConfig {
		return fasthttp.RequestConfig{ReadTimeout: time.Hour, MaxRequestBodySize: 1}
	}
	s.serve(srv.Serve)
	return l
}

// connState runs on every state change, twice per request (active, idle):
// those move the connection's own timeouts; only the changes that add or
// remove a connection take the listener's lock, which every connection's
// goroutine shares.
func (l *Listener) connState(nc net.Conn, st fasthttp.ConnState) {
	c, _ := nc.(*conn)
	switch st {
	case fasthttp.StateActive:
		if c != nil {
			c.active()
		}
	case fasthttp.StateIdle:
		if c != nil {
			c.idle()
		}
	case fasthttp.StateNew:
		l.mu.Lock()
		l.conns[nc] = struct{}{}
		l.mu.Unlock()
	case fasthttp.StateHijacked:
		if c != nil {
			c.handOff()
		}
		fallthrough
	case fasthttp.StateClosed:
		l.mu.Lock()
		delete(l.conns, nc)
		l.mu.Unlock()
	}
}

// Shutdown stops accepting, waits for in-flight requests until ctx ends,
// then closes every connection left.
func (l *Listener) Shutdown(ctx context.Context) error {
	err := l.srv.ShutdownWithContext(ctx)
	// fasthttp's Shutdown does nothing when Serve has not registered the
	// listener yet; closing it here makes Serve return in every case.
	l.StopAccepting()
	if err != nil {
		// The grace period is over: what is still open is cut.
		l.mu.Lock()
		for c := range l.conns {
			c.Close()
		}
		l.mu.Unlock()
	}
	<-l.done
	return err
}

// waitDrains waits for the background drains of replaced listeners until
// ctx ends, then cancels them (cutting what they still serve) and waits for
// them to return.
func waitDrains(ctx context.Context, wg *sync.WaitGroup, cancel context.CancelFunc) {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	cancel()
	<-done
}
