package listener

import (
	"context"
	"net"
	"net/http"
)

// HTTP is a net/http server bound to one address: for the gRPC egress,
// whose h2c fasthttp cannot serve (and for the admin listener).
type HTTP struct {
	*socket
	srv *http.Server
}

// StartHTTP listens on addr and serves srv there under lim. srv.ConnState
// is wrapped to keep the idle timeout per connection (httpConn); srv's
// own ReadHeaderTimeout and IdleTimeout, when set, apply as well.
func StartHTTP(addr string, srv *http.Server, lim Limits, cfg Config) (*HTTP, error) {
	s, err := listen(addr, false, lim, cfg)
	if err != nil {
		return nil, err
	}
	return startHTTPOn(s, srv), nil
}

func startHTTPOn(s *socket, srv *http.Server) *HTTP {
	next := srv.ConnState
	srv.ConnState = func(nc net.Conn, st http.ConnState) {
		if c, ok := nc.(*httpConn); ok {
			c.state(st)
		}
		if next != nil {
			next(nc, st)
		}
	}
	// net/http's Serve closes its listener when it returns, which would
	// leave nothing to restart it on: the socket is closed here instead
	// (Shutdown, StopAccepting).
	s.serve(func(ln net.Listener) error { return srv.Serve(keepOpen{ln}) })
	return &HTTP{socket: s, srv: srv}
}

// keepOpen is a listener whose Close leaves the socket open.
type keepOpen struct{ net.Listener }

func (keepOpen) Close() error { return nil }

// Shutdown stops accepting, lets in-flight requests finish until ctx ends,
// then cuts what is left, and waits for Serve to return.
func (h *HTTP) Shutdown(ctx context.Context) error {
	// Serve's Accept returns once the socket is closed: net/http reports
	// that as the accept error, which the serve loop, seeing the socket
	// closed, takes for the end it is.
	h.StopAccepting()
	err := h.srv.Shutdown(ctx)
	if err != nil {
		h.srv.Close()
	}
	<-h.done
	return err
}
