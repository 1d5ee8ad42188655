package egress

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warden-dev/warden/connpool"
	"github.com/warden-dev/warden/governor/control"
	"github.com/warden-dev/warden/internal/hostport"
	"github.com/warden-dev/warden/proxy/admit"
	"github.com/warden-dev/warden/proxy/httpwire"
	"github.com/warden-dev/warden/proxy/respond"
)

// forwardedMethods is what the egress passes on, for Allow.
const forwardedMethods = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, TRACE, CONNECT"

// maxAuthority bounds the normalised host:port a route is looked up by.
const maxAuthority = 300

// handle serves a request. One refused from its head, its body unread,
// closes with a linger when more of the body may follow than fasthttp
// drops by itself, so that the client sees the refusal, not a reset.
func (e *Egress) handle(ctx *fasthttp.RequestCtx) {
	if !e.serve(ctx) {
		e.tunnels.LingerUnread(ctx)
	}
}

// serve is the request path: framing checks, the target, admission, then
// the exchange (a tunnel for CONNECT). It reports whether the request went
// on to the exchange or the tunnel, which take its body, or ended with its
// client gone; a refusal leaves the body unread.
func (e *Egress) serve(ctx *fasthttp.RequestCtx) (went bool) {
	tb := e.table.Load()
	if tb == nil {
		respond.Error(ctx, fasthttp.StatusServiceUnavailable, "egress is not configured")
		return false
	}
	var hd head
	if !e.readHead(ctx, tb, &hd, ctx.Time()) {
		return false
	}
	if hd.r == nil {
		e.connect(ctx, tb, hd.scan)
		return true
	}
	r := hd.r
	// Answered before admission, as a framing refusal is: the request
	// reaches no upstream. expect leaves it to here: it changes the header.
	if code := respond.MaxForwards(ctx, hd.scan.Fields, forwardedMethods); code != 0 {
		r.Stats.Done(code, ctx.Time())
		return false
	}
	x := getExchange(e, r, ctx.Time())
	now := e.now(ctx.Time())
	caps := tb.caps
	if ctx.Request.MayContinue() {
		// expect counted it against its tenant before the body came.
		caps = nil
	}
	x.wait.Reset(ctx.Conn(), e.opts.Clock, x.deadline())
	ref, ok := admit.Admit(&x.wait, &x.adm, &r.Target, caps, hd.scan.Want, "egress", now)
	gone := x.wait.ClientGone()
	x.wait.End()
	if !ok {
		if gone {
			x.clientGone(ctx)
			return true
		}
		x.code = e.refuseAdmission(ctx, r, ref, now)
		x.done()
		return false
	}
	// The request as the upstream must see it.
	h := &ctx.Request.Header
	x.req.Upgrade = httpwire.StripRequestKeepingUpgrade(h, hd.scan.Fields)
	if hd.absolute {
		// authority and origin point into the request line that setOrigin
		// rewrites, so the Host is copied out first.
		h.SetHostBytes(hd.authority)
		setOrigin(h, hd.origin)
	}
	if r.hostHeader != nil {
		h.SetHostBytes(r.hostHeader)
	}
	https := hd.https
	if r.fixed != nil {
		https = r.fixed.Config().TLS != nil
	}
	e.exchange(ctx, x, e.pool(r, https, hd.ab[:hd.n]), hd.scan.Fields)
	return true
}

// head is what a request's head decides before admission.
type head struct {
	scan httpwire.Scan
	r    *route // nil for CONNECT, which connect routes itself
	// absolute is an absolute-form request target (HTTP_PROXY), split
	// into authority and origin; otherwise authority is the Host.
	absolute          bool
	https             bool
	authority, origin []byte
	ab                [maxAuthority]byte // the normalised host:port is ab[:n]
	n                 int
}

// readHead runs the checks a request's head decides: framing, the target
// host, its route and a loop back to this listener; the request arrived at
// start. It answers and counts a refusal itself, returning false. For
// CONNECT it stops after the framing.
func (e *Egress) readHead(ctx *fasthttp.RequestCtx, tb *table, hd *head, start time.Time) bool {
	h := &ctx.Request.Header
	if err := httpwire.CheckVersion(h.Protocol()); err != nil {
		e.refuseAt(ctx, fasthttp.StatusHTTPVersionNotSupported, "request refused: "+err.Error(), start)
		return false
	}
	var err error
	hd.scan, err = httpwire.ScanRequestHeaders(h.RawHeaders(), tb.tenantHeader)
	if err != nil {
		e.refuseAt(ctx, fasthttp.StatusBadRequest, "request refused: "+err.Error(), start)
		return false
	}
	if h.IsConnect() {
		return true
	}
	// The target host: from the absolute-form target (HTTP_PROXY), else
	// from Host (origin-form addressed to a target).
	uri := h.RequestURI()
	if len(uri) > 0 && uri[0] != '/' && uri[0] != '*' {
		scheme, a, o, ok := httpwire.SplitAbsoluteForm(uri)
		if !ok {
			e.refuseAt(ctx, fasthttp.StatusBadRequest, "request target is neither origin-form nor an http(s) absolute URI", start)
			return false
		}
		hd.absolute, hd.https = true, len(scheme) == 5
		hd.authority, hd.origin = a, o
	} else {
		if hd.scan.Fields&httpwire.HasHost == 0 {
			e.refuseAt(ctx, fasthttp.StatusBadRequest, "no target host: send an absolute URI or a Host header", start)
			return false
		}
		hd.authority = h.Host()
	}
	hp, hostLen, ok := hostport.Append(hd.ab[:0], hd.authority, defaultPort(hd.https))
	if !ok {
		e.refuseAt(ctx, fasthttp.StatusBadRequest, "target host "+strconv.Quote(string(hd.authority))+" is not a host[:port]", start)
		return false
	}
	hd.n = len(hp)
	r := e.route(ctx, tb, hp, hostLen, start)
	if r == nil {
		return false
	}
	if r.fixed == nil && tb.loops(hp, hostLen) {
		e.refuseAt(ctx, fasthttp.StatusBadRequest, "request addressed to the egress listener itself", start)
		return false
	}
	hd.r = r
	return true
}

// expect answers a request that asks to be told before it sends its body
// (Expect: 100-continue; curl asks for bodies over 1 MiB): what its head
// decides runs now, with the controls that hold nothing (admit.Ask: the
// tenant cap, counted here and not again by serve, and an open breaker),
// so that a refusal goes out before the client uploads a body only to have
// it dropped. fasthttp sends a refusal as it is and closes the connection,
// which the client may already be sending the body on.
func (e *Egress) expect(ctx *fasthttp.RequestCtx) int {
	tb := e.table.Load()
	if tb == nil {
		return fasthttp.StatusContinue // serve answers 503
	}
	// fasthttp stamps the request's time (ctx.Time) after this call.
	start := time.Now()
	var hd head
	if !e.readHead(ctx, tb, &hd, start) {
		return ctx.Response.StatusCode()
	}
	r := hd.r
	if r == nil {
		return fasthttp.StatusContinue // CONNECT has no body
	}
	now := e.now(start)
	ref, ok := admit.Ask(&r.Target, tb.caps, hd.scan.Want, "egress", now)
	if ok {
		return fasthttp.StatusContinue
	}
	code := e.refuseAdmission(ctx, r, ref, now)
	r.Stats.Done(code, start)
	return code
}

// setOrigin makes an absolute-form target origin-form for the upstream.
func setOrigin(h *fasthttp.RequestHeader, origin []byte) {
	if len(origin) == 0 && h.IsOptions() {
		// RFC 9112 §3.2.4: an OPTIONS for the server as a whole
		// (http://host with no path) goes on in asterisk-form.
		h.SetRequestURI("*")
		return
	}
	if len(origin) == 0 || origin[0] == '?' {
		var b [1]byte
		b[0] = '/'
		h.SetRequestURIBytes(append(b[:], origin...))
		return
	}
	h.SetRequestURIBytes(origin)
}

func defaultPort(https bool) string {
	if https {
		return "443"
	}
	return "80"
}

// now is the request's time for windows and pools: the instant it
// arrived, already read, unless a test clock is in charge.
func (e *Egress) now(arrived time.Time) time.Time {
	if e.realClock {
		return arrived
	}
	return e.opts.Clock.Now()
}

// route finds the route for a normalised authority, or answers the 403
// for a host no target lists (when unlisted hosts are refused) and returns
// nil.
func (e *Egress) route(ctx *fasthttp.RequestCtx, tb *table, hostport []byte, hostLen int, start time.Time) *route {
	r := tb.lookup(hostport, hostLen)
	if r == nil {
		respond.Unlisted(ctx, hostport[:hostLen])
		e.stats.Reject(control.AllowUnlisted, "egress")
		e.stats.Target(unlistedName).Done(fasthttp.StatusForbidden, start)
	}
	return r
}

// refuse answers a request that was not understood, before any target was
// chosen (also one the listener could not read: a malformed head or
// framing), and counts it as an unlisted host's.
func (e *Egress) refuse(ctx *fasthttp.RequestCtx, status int, msg string) {
	e.refuseAt(ctx, status, msg, ctx.Time())
}

// refuseAt is refuse for a request that arrived at start.
func (e *Egress) refuseAt(ctx *fasthttp.RequestCtx, status int, msg string, start time.Time) {
	respond.Error(ctx, status, msg)
	e.stats.Target(unlistedName).Done(status, start)
}

// refuseAdmission writes the refusal of a control and counts it.
func (e *Egress) refuseAdmission(ctx *fasthttp.RequestCtx, r *route, ref admit.Refusal, now time.Time) int {
	if errors.Is(ref.Err, context.DeadlineExceeded) {
		// The target's timeout passed while the request waited in a pool.
		r.Stats.Reject(control.Timeout, r.Name)
		return respond.Upstream(ctx, r.Name, &connpool.Error{Kind: connpool.KindTimeout, Op: "wait in", Addr: "pool " + ref.Scope, Err: ref.Err})
	}
	r.Stats.Reject(ref.Control, ref.Scope)
	switch {
	case ref.ByTenantCap():
		respond.Tenant(ctx, ref.Tenant, now)
		return fasthttp.StatusTooManyRequests
	case ref.Control == control.CircuitBreaker:
		respond.Breaker(ctx, r.Name, ref.RetryAfter)
		return fasthttp.StatusServiceUnavailable
	case ref.Pool != nil:
		respond.Pool(ctx, ref.Pool, r.Name)
		return fasthttp.StatusTooManyRequests
	default:
		respond.Error(ctx, fasthttp.StatusServiceUnavailable, "gave up waiting for a pool: "+ref.Err.Error())
		return fasthttp.StatusServiceUnavailable
	}
}

// loops reports whether a request for hp would come back to this
// listener.
func (tb *table) loops(hp []byte, hostLen int) bool {
	return hostport.SelfAddressed(tb.self, hp, hostLen)
}
