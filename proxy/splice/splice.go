// Package splice takes over client connections that HTTP has handed over.
// It joins one to an upstream connection (a CONNECT tunnel, a protocol
// switched by 101) and copies bytes both ways, unread, until both sides are
// done; or it writes the answer to a request whose body was cut short and
// then closes with a linger (Set.Linger). A Set keeps the open ones, so
// that a drain can wait for them and then cut them.
package splice

import (
	"context"
	"io"
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// Tunnel is one client connection joined to one upstream connection.
type Tunnel struct {
	up io.ReadWriteCloser

	mu     sync.Mutex
	client net.Conn
	closed bool
}

// New returns a tunnel to up. up is closed when the tunnel ends; when it
// has CloseWrite, the client's end of stream is passed on by half-closing
// it.
func New(up io.ReadWriteCloser) *Tunnel { return &Tunnel{up: up} }

// Run writes greeting to client (the answer that turned the connection
// into a tunnel), then copies bytes both ways until both sides are done,
// and closes both. A tunnel already closed (a drain cut it before Run)
// closes the upstream and returns.
func (t *Tunnel) Run(client net.Conn, greeting []byte) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		t.up.Close()
		return
	}
	t.client = client
	t.mu.Unlock()
	if _, err := client.Write(greeting); err != nil {
		t.Close()
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(t.up, client)
		closeWrite(t.up)
	}()
	_, _ = io.Copy(client, t.up)
	// The upstream is done sending: the client must see the end of the
	// stream (a server may speak until it closes), while it may still be
	// sending itself. fasthttp's wrapper of a hijacked connection cannot
	// half-close; the connection under it can.
	if u, ok := client.(interface{ UnsafeConn() net.Conn }); ok {
		closeWrite(u.UnsafeConn())
	}
	<-done
	t.Close()
}

// closeWrite half-closes c so the peer sees the end of this direction
// while the other direction finishes; c is closed when it cannot.
func closeWrite(c io.Closer) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	_ = c.Close()
}

// Close ends the tunnel now: both connections are closed, and a Run not
// yet started returns at once.
func (t *Tunnel) Close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	t.up.Close()
	if t.client != nil {
		// fasthttp closes a hijacked connection only when the hijack
		// handler returns, so Close alone would not wake a blocked read; a
		// past deadline does.
		_ = t.client.SetDeadline(longPast)
		t.client.Close()
	}
}

// longPast is a deadline that has passed: a read or write under way, or
// blocked, fails at once.
var longPast = time.Unix(1, 0)

// Set tracks the open tunnels so that shutdown can wait for them and cut
// them at the deadline. The zero value is ready.
type Set struct {
	mu       sync.Mutex
	open     map[closer]struct{}
	draining bool
	empty    chan struct{} // closed when the last tunnel ends while draining
}

// closer is a connection taken over: a *Tunnel, or a lingering close.
type closer interface{ Close() }

// Add records t as open; false when a drain has begun, and t must not run.
func (s *Set) Add(t *Tunnel) bool { return s.add(t) }

func (s *Set) add(t closer) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.draining {
		return false
	}
	if s.open == nil {
		s.open = map[closer]struct{}{}
	}
	s.open[t] = struct{}{}
	return true
}

// Hijack makes the connection of ctx, once its handler returns, the client
// end of a tunnel to up: the answer now in ctx.Response (a 101 Switching
// Protocols) is written first, as it stands, and then bytes pass both
// ways until both sides are done; ended, when set, is called then. The
// connection's deadlines are lifted: a switched protocol keeps its own
// time. It reports false, having closed up and written nothing, when a
// drain has begun.
func (s *Set) Hijack(ctx *fasthttp.RequestCtx, up io.ReadWriteCloser, ended func()) bool {
	// Copied: ctx's response is reused before the hijacked connection is
	// written.
	head := append([]byte(nil), ctx.Response.Header.Header()...)
	t := New(up)
	if !s.Add(t) {
		up.Close()
		return false
	}
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(c net.Conn) {
		defer s.Remove(t)
		if ended != nil {
			defer ended()
		}
		_ = c.SetDeadline(time.Time{})
		t.Run(c, head)
	})
	return true
}

// Remove records that t has ended.
func (s *Set) Remove(t *Tunnel) { s.remove(t) }

func (s *Set) remove(t closer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.open, t)
	if s.draining && len(s.open) == 0 && s.empty != nil {
		close(s.empty)
		s.empty = nil
	}
}

// Drain refuses new tunnels, waits for the open ones until ctx ends, then
// closes them and returns ctx's error.
func (s *Set) Drain(ctx context.Context) error {
	s.mu.Lock()
	s.draining = true
	if len(s.open) == 0 {
		s.mu.Unlock()
		return nil
	}
	empty := make(chan struct{})
	s.empty = empty
	s.mu.Unlock()
	select {
	case <-empty:
		return nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	open := make([]closer, 0, len(s.open))
	for t := range s.open {
		open = append(open, t)
	}
	s.mu.Unlock()
	for _, t := range open {
		t.Close()
	}
	// Closed tunnels end at once; the bound only guards against a hijack
	// handler fasthttp never ran.
	select {
	case <-empty:
	case <-time.After(time.Second):
	}
	return ctx.Err()
}
