// Package listener runs one server on one address for a proxy component
// (fasthttp: Start; net/http: StartHTTP), and drains it: StopAccepting
// closes its socket at once, Shutdown stops accepting, lets in-flight
// requests finish until the context's deadline, then closes whatever is
// left. Hijacked connections (CONNECT tunnels) are
// the hijacker's to track. A Slot keeps a component's server across
// reloads: it binds a moved address, drains the replaced server in the
// background, and waits for those drains on shutdown.
package listener

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"

	"github.com/valyala/fasthttp"

	"github.com/warden-dev/warden/internal/rawio"
)

// Listener is a fasthttp server bound to one address.
type Listener struct {
	srv  *fasthttp.Server
	ln   *onceCloser
	done chan struct{}
	log  *slog.Logger

	mu    sync.Mutex
	conns map[net.Conn]struct{} // every connection the server holds
}

// Start listens on addr and serves srv there. srv.ConnState is taken over
// to track connections.
func Start(addr string, srv *fasthttp.Server, log *slog.Logger) (*Listener, error) {
	l := &Listener{srv: srv, log: log, conns: map[net.Conn]struct{}{}}
	srv.ConnState = l.connState
	srv.CloseOnShutdown = true
	var err error
	// The fasthttp servers carry the data plane: their connections read and
	// write with raw calls (see internal/rawio).
	serveRaw := func(ln net.Listener) error { return srv.Serve(rawio.Listener(ln)) }
	if l.ln, l.done, err = serve(addr, serveRaw, net.ErrClosed, log); err != nil {
		return nil, err
	}
	return l, nil
}

// serve listens on addr and runs serveOn there in a goroutine, logging how
// it ended unless that is the stopped error or the listener closed by
// StopAccepting; done is closed when it has returned.
func serve(addr string, serveOn func(net.Listener) error, stopped error, log *slog.Logger) (ln *onceCloser, done chan struct{}, err error) {
	raw, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	ln = &onceCloser{Listener: raw}
	done = make(chan struct{})
	go func() {
		defer close(done)
		// net/http's Serve returns the accept error when the listener was
		// closed under it rather than by its Shutdown: that is
		// StopAccepting, not a failure.
		if err := serveOn(ln); err != nil && !errors.Is(err, stopped) && !errors.Is(err, net.ErrClosed) {
			log.Error("listener stopped", "addr", addr, "err", err)
		}
	}()
	return ln, done, nil
}

// onceCloser is a server's listening socket. StopAccepting closes it ahead
// of the server's Shutdown, which closes it again and reports that second
// Close's error as its own: only the first Close reaches the socket, and
// later ones return its result.
type onceCloser struct {
	net.Listener
	once sync.Once
	err  error
}

func (l *onceCloser) Close() error {
	l.once.Do(func() { l.err = l.Listener.Close() })
	return l.err
}

// Addr is the bound address (useful with port 0).
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }

// StopAccepting closes the listening socket: new connections are refused
// from now on, while the connections already accepted are served until
// Shutdown drains them.
func (l *Listener) StopAccepting() { _ = l.ln.Close() }

// connState runs on every state change, twice per request (active, idle);
// only the changes that add or remove a connection take the lock, which
// every connection's goroutine shares.
func (l *Listener) connState(c net.Conn, st fasthttp.ConnState) {
	switch st {
	case fasthttp.StateNew:
		l.mu.Lock()
		l.conns[c] = struct{}{}
		l.mu.Unlock()
	case fasthttp.StateClosed, fasthttp.StateHijacked:
		l.mu.Lock()
		delete(l.conns, c)
		l.mu.Unlock()
	}
}

// Shutdown stops accepting, waits for in-flight requests until ctx ends,
// then closes every connection left.
func (l *Listener) Shutdown(ctx context.Context) error {
	err := l.srv.ShutdownWithContext(ctx)
	// fasthttp's Shutdown does nothing when Serve has not registered the
	// listener yet; closing it here makes Serve return in every case.
	_ = l.ln.Close()
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
