package egress

import (
	"context"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warden-dev/warden/connpool"
	"github.com/warden-dev/warden/governor/breaker"
	"github.com/warden-dev/warden/proxy/admit"
	"github.com/warden-dev/warden/proxy/clientwait"
	"github.com/warden-dev/warden/proxy/httpwire"
	"github.com/warden-dev/warden/proxy/respond"
)

// defaultConnectTimeout bounds dialling a tunnel whose target has no
// timeout.
const defaultConnectTimeout = 10 * time.Second

// connect opens a CONNECT tunnel: the target's controls apply to opening
// it (tenant cap, breaker, pools), and a failed dial counts against the
// breaker. What passes through the tunnel is opaque, so its status codes
// are invisible to the breaker. The pool slot is held while the tunnel is
// open.
func (e *Egress) connect(ctx *fasthttp.RequestCtx, tb *table, scan httpwire.Scan) {
	authority := ctx.Request.Header.RequestURI()
	var ab [maxAuthority]byte
	hostport, hostLen, ok := httpwire.AppendHostPort(ab[:0], authority, "443")
	if !ok {
		e.refuse(ctx, fasthttp.StatusBadRequest, "CONNECT target "+strconv.Quote(string(authority))+" is not host:port")
		return
	}
	r := e.route(ctx, tb, hostport, hostLen, ctx.Time())
	if r == nil {
		return
	}
	addr := r.upstreamAddr
	if addr == "" {
		if tb.loops(hostport, hostLen) {
			e.refuse(ctx, fasthttp.StatusBadRequest, "CONNECT to the egress listener itself")
			return
		}
		addr = string(hostport)
	}
	t := &tunnel{e: e, r: r, start: ctx.Time()}
	now := e.now(ctx.Time())
	// Waits end when the client hangs up, not when a drain begins. The
	// hijacked connection is read only after this handler returns, so the
	// client check is over by then.
	var wait clientwait.Wait
	wait.Reset(ctx.Conn(), e.opts.Clock, time.Time{})
	defer wait.End()
	if ref, ok := admit.Admit(&wait, &t.adm, &r.Target, tb.caps, scan.Want, "egress", now); !ok {
		if wait.ClientGone() {
			t.clientGone(ctx)
		} else {
			r.Stats.Done(e.refuseAdmission(ctx, r, ref, now), t.start)
		}
		return
	}
	timeout := r.Timeout
	if timeout <= 0 {
		timeout = defaultConnectTimeout
	}
	d := net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}
	// Not the RequestCtx itself: the dialer derives a context from it,
	// whose watcher goroutine can outlive this handler and then read the
	// RequestCtx after fasthttp recycled it (a race seen under -race).
	up, err := d.DialContext(wait.Context(), "tcp", addr)
	if err != nil {
		gone := wait.ClientGone()
		outcome := breaker.Failure
		if gone {
			// Nobody asked for the tunnel any more: the target is not
			// to blame.
			outcome = breaker.Neutral
		}
		t.adm.Ticket.Done(outcome)
		t.adm.Release()
		if gone {
			t.clientGone(ctx)
			return
		}
		kind := connpool.KindDial
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			kind = connpool.KindTimeout
		}
		err = &connpool.Error{Kind: kind, Op: "CONNECT", Addr: addr, Err: err}
		code := respond.Upstream(ctx, r.Name, err)
		_, control := respond.UpstreamStatus(err)
		r.Stats.Reject(control, r.Name)
		r.Stats.Done(code, t.start)
		return
	}
	t.adm.Ticket.Done(breaker.Success)
	t.up = up
	if !e.tunnels.add(t) {
		up.Close()
		t.adm.Release()
		respond.Error(ctx, fasthttp.StatusServiceUnavailable, "egress is shutting down")
		return
	}
	r.Stats.Done(fasthttp.StatusOK, t.start)
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(t.run)
}

// tunnel is one open CONNECT tunnel.
type tunnel struct {
	e     *Egress
	r     *route
	adm   admit.Admission
	start time.Time
	up    net.Conn

	mu     sync.Mutex
	client net.Conn
	closed bool
}

var established = []byte("HTTP/1.1 200 Connection Established\r\n\r\n")

// run pumps bytes both ways until either side is done, then closes both.
func (t *tunnel) run(client net.Conn) {
	defer t.e.tunnels.remove(t)
	defer t.adm.Release()
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		t.up.Close()
		return
	}
	t.client = client
	t.mu.Unlock()
	if _, err := client.Write(established); err != nil {
		t.close()
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
	t.close()
}

// closeWrite half-closes c so the peer sees the end of this direction
// while the other direction finishes.
func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	_ = c.Close()
}

func (t *tunnel) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	t.up.Close()
	if t.client != nil {
		// fasthttp closes a hijacked connection only when the hijack
		// handler returns, so Close alone would not wake a blocked read; a
		// past deadline does.
		_ = t.client.SetDeadline(time.Unix(1, 0))
		t.client.Close()
	}
}

// tunnels tracks the open tunnels so that shutdown can wait for them and
// cut them at the deadline.
type tunnels struct {
	mu       sync.Mutex
	open     map[*tunnel]struct{}
	draining bool
	empty    chan struct{} // closed when the last tunnel ends while draining
}

func (ts *tunnels) add(t *tunnel) bool {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.draining {
		return false
	}
	ts.open[t] = struct{}{}
	return true
}

func (ts *tunnels) remove(t *tunnel) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	delete(ts.open, t)
	if ts.draining && len(ts.open) == 0 && ts.empty != nil {
		close(ts.empty)
		ts.empty = nil
	}
}

// drain refuses new tunnels, waits for open ones until ctx ends, then
// closes them.
func (ts *tunnels) drain(ctx context.Context) error {
	ts.mu.Lock()
	ts.draining = true
	if len(ts.open) == 0 {
		ts.mu.Unlock()
		return nil
	}
	empty := make(chan struct{})
	ts.empty = empty
	ts.mu.Unlock()
	select {
	case <-empty:
		return nil
	case <-ctx.Done():
	}
	ts.mu.Lock()
	open := make([]*tunnel, 0, len(ts.open))
	for t := range ts.open {
		open = append(open, t)
	}
	ts.mu.Unlock()
	for _, t := range open {
		t.close()
	}
	// Closed tunnels end at once; the bound only guards against a hijack
	// handler fasthttp never ran.
	select {
	case <-empty:
	case <-time.After(time.Second):
	}
	return ctx.Err()
}

// clientGone ends a CONNECT whose client hung up while it waited: as
// exchange.clientGone, nothing is written and no refusal is counted.
func (t *tunnel) clientGone(ctx *fasthttp.RequestCtx) {
	ctx.SetConnectionClose()
	t.r.Stats.Done(clientwait.StatusGone, t.start)
}
