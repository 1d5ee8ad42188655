package egress

import (
	"net"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warden-dev/warden/connpool"
	"github.com/warden-dev/warden/governor/breaker"
	"github.com/warden-dev/warden/internal/hostport"
	"github.com/warden-dev/warden/proxy/admit"
	"github.com/warden-dev/warden/proxy/clientwait"
	"github.com/warden-dev/warden/proxy/httpwire"
	"github.com/warden-dev/warden/proxy/respond"
	"github.com/warden-dev/warden/proxy/splice"
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
	hostport, hostLen, ok := hostport.Append(ab[:0], authority, "443")
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
		_, ctl := respond.UpstreamStatus(err)
		r.Stats.Reject(ctl, r.Name)
		r.Stats.Done(code, t.start)
		return
	}
	t.adm.Ticket.Done(breaker.Success)
	t.sp = splice.New(up)
	if !e.tunnels.Add(t.sp) {
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
	sp    *splice.Tunnel
}

// established is the tunnel's 200 as of now: warden originates it, so it
// carries a Date as RFC 9110 §6.6.1 asks (Envoy's does too).
func established(now time.Time) []byte {
	b := make([]byte, 0, 96)
	b = append(b, "HTTP/1.1 200 Connection Established\r\nDate: "...)
	b = fasthttp.AppendHTTPDate(b, now)
	return append(b, "\r\n\r\n"...)
}

// run pumps bytes both ways until either side is done, then closes both;
// the pool slot is held until then.
func (t *tunnel) run(client net.Conn) {
	defer t.e.tunnels.Remove(t.sp)
	defer t.adm.Release()
	t.sp.Run(client, established(t.e.opts.Clock.Now()))
}

// switchProtocols passes on the upstream's 101 Switching Protocols to a
// request that asked to switch (a WebSocket), and joins the client's
// connection to the upstream's, as a CONNECT tunnel is joined: the breaker
// counted the 101 a success, the request is counted with it now, and the
// pool slot is held until both sides are done.
func (e *Egress) switchProtocols(ctx *fasthttp.RequestCtx, x *exchange) {
	adm := x.adm
	x.adm = admit.Admission{} // the tunnel's now
	x.code = fasthttp.StatusSwitchingProtocols
	if !e.tunnels.Hijack(ctx, x.req.Switched, adm.Release) {
		adm.Release()
		respond.Error(ctx, fasthttp.StatusServiceUnavailable, "egress is shutting down")
		x.code = fasthttp.StatusServiceUnavailable
	}
	x.done()
}

// clientGone ends a CONNECT whose client hung up while it waited: as
// exchange.clientGone, nothing is written and no refusal is counted.
func (t *tunnel) clientGone(ctx *fasthttp.RequestCtx) {
	ctx.SetConnectionClose()
	t.r.Stats.Done(clientwait.StatusGone, t.start)
}
