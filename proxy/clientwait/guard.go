package clientwait

import (
	"errors"
	"net"
	"sync"

	"github.com/warden-dev/warden/connpool"
	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/internal/rawio"
)

// Guard looks, every CheckInterval while a request is sent upstream and
// its answer awaited, whether the request's client has hung up, and if so
// gives the exchange up, as Envoy and nginx reset the upstream request of
// a client that left: an answer nobody will read would otherwise hold an
// upstream connection, and a pool's slot, until it came or the timeout
// passed. It lives in a pooled exchange and is reused: after the first
// Start it allocates nothing. Stop leaves the timer running: it fires once
// more, finds the guard off, and stops, and a Start before that keeps it,
// checking its request sooner than CheckInterval after Start. A guard
// serving request after request so re-arms its timer once a CheckInterval
// rather than twice a request (a reset and a stop, about 80 ns here).
type Guard struct {
	abort connpool.Abort

	mu   sync.Mutex
	clk  clock.Clock
	t    clock.Timer
	conn net.Conn
	on   bool
	// armed: t will call check.
	armed bool
}

// Start readies req to be given up, and watches conn, the connection of
// the client req is for, until Stop.
func (g *Guard) Start(clk clock.Clock, conn net.Conn, req *connpool.Request) {
	g.abort.Reset()
	req.Abort = &g.abort
	g.mu.Lock()
	defer g.mu.Unlock()
	g.conn, g.on = conn, true
	if g.t == nil || g.clk != clk {
		if g.t != nil {
			g.t.Stop()
		}
		g.clk = clk
		g.t = clk.AfterFunc(CheckInterval, g.check)
		g.armed = true
		return
	}
	if !g.armed {
		g.t.Reset(CheckInterval)
		g.armed = true
	}
}

// Stop ends the watch once the exchange is over; err is what it ended
// with. It reports whether the exchange was given up because the client
// had gone: only the guard aborts, so that is an ErrAbandoned.
func (g *Guard) Stop(err error) (gone bool) {
	g.mu.Lock()
	g.on = false
	g.conn = nil
	g.mu.Unlock()
	return errors.Is(err, connpool.ErrAbandoned)
}

// check runs on the timer. One that fires after Stop finds the guard off,
// and leaves the timer stopped, or started again for the next request,
// which it checks as that request's own timer would.
func (g *Guard) check() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.armed = false
	if !g.on {
		return
	}
	if rawio.Peek(g.conn) == rawio.PeekClosed {
		g.on = false
		g.abort.Abort()
		return
	}
	g.t.Reset(CheckInterval)
	g.armed = true
}
