package listener

import (
	"context"
	"log/slog"
	"net"
	"net/http"
)

// HTTP is a net/http server bound to one address: for the gRPC egress,
// whose h2c fasthttp cannot serve.
type HTTP struct {
	srv  *http.Server
	ln   *onceCloser
	done chan struct{} // closed when Serve has returned
}

// StartHTTP listens on addr and serves srv there.
func StartHTTP(addr string, srv *http.Server, log *slog.Logger) (*HTTP, error) {
	ln, done, err := serve(addr, srv.Serve, http.ErrServerClosed, log)
	if err != nil {
		return nil, err
	}
	return &HTTP{srv: srv, ln: ln, done: done}, nil
}

// Addr is the bound address (useful with port 0).
func (h *HTTP) Addr() net.Addr { return h.ln.Addr() }

// StopAccepting closes the listening socket: new connections are refused
// from now on, while the connections already accepted are served until
// Shutdown drains them.
func (h *HTTP) StopAccepting() { _ = h.ln.Close() }

// Shutdown stops accepting, lets in-flight requests finish until ctx ends,
// then cuts what is left, and waits for Serve to return.
func (h *HTTP) Shutdown(ctx context.Context) error {
	err := h.srv.Shutdown(ctx)
	if err != nil {
		h.srv.Close()
	}
	<-h.done
	return err
}
