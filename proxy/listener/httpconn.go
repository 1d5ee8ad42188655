package listener

import (
	"errors"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warden-dev/warden/policy"
)

// httpConn is a connection of a net/http listener (the gRPC egress, h2c).
// net/http's own ReadHeaderTimeout and IdleTimeout are fixed when its
// server starts serving, and HTTP/2's idle timeout gives no sign that it
// fired; kept here instead, they follow reloads (for connections accepted
// from then on) and are counted:
//
//   - header, from the accept until net/http lifts the read deadline,
//     which it does once the HTTP/2 preface is in (an HTTP/1 server: once
//     it sets its own);
//   - idle, from the moment the connection has no request in progress
//     (the server's StateIdle, which HTTP/2 reports when its last stream
//     ends) to the next one (StateActive): the connection is then closed.
//
// A stalled request stream is the handler's to bound (proxy/grpcegress).
type httpConn struct {
	counted
	to   policy.ListenerTimeouts
	head atomic.Bool // the header timeout runs

	mu     sync.Mutex
	timer  *time.Timer // the idle timeout; nil until the first idle period
	idling bool
	idleAt time.Time // when the idle period in progress began
}

func newHTTPConn(c net.Conn, g *gate, to policy.ListenerTimeouts) *httpConn {
	hc := &httpConn{counted: counted{Conn: c, g: g}, to: to}
	if to.Header > 0 {
		hc.head.Store(true)
		_ = c.SetReadDeadline(after(to.Header))
	}
	return hc
}

func (c *httpConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil && c.head.Load() && errors.Is(err, os.ErrDeadlineExceeded) {
		c.timedOut(c.g.m.header.Inc)
	}
	return n, err
}

// SetReadDeadline ends the header timeout: net/http sets a deadline only
// once the preface is in.
func (c *httpConn) SetReadDeadline(t time.Time) error {
	c.head.Store(false)
	return c.Conn.SetReadDeadline(t)
}

func (c *httpConn) SetDeadline(t time.Time) error {
	c.head.Store(false)
	return c.Conn.SetDeadline(t)
}

func (c *httpConn) Close() error {
	c.mu.Lock()
	c.idling = false
	if c.timer != nil {
		c.timer.Stop()
	}
	c.mu.Unlock()
	return c.counted.Close()
}

// state follows the server's ConnState: the idle timeout runs while the
// connection is idle.
func (c *httpConn) state(st http.ConnState) {
	if c.to.Idle <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.idling = st == http.StateIdle
	switch {
	case !c.idling:
		if c.timer != nil {
			c.timer.Stop()
		}
	case c.timer == nil:
		c.idleAt = time.Now()
		c.timer = time.AfterFunc(c.to.Idle, c.idleExpired)
	default:
		c.idleAt = time.Now()
		c.timer.Reset(c.to.Idle)
	}
}

// idleExpired closes the connection if it has been idle for the whole
// timeout: a timer that fires as the connection goes active, or for an
// earlier idle period, finds it otherwise.
func (c *httpConn) idleExpired() {
	c.mu.Lock()
	due := c.idling && !time.Now().Before(c.idleAt.Add(c.to.Idle))
	c.mu.Unlock()
	if due {
		c.timedOut(c.g.m.idle.Inc)
		_ = c.Close()
	}
}
