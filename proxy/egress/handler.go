package egress

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warden-dev/warden/connpool"
	"github.com/warden-dev/warden/proxy/admit"
	"github.com/warden-dev/warden/proxy/httpwire"
	"github.com/warden-dev/warden/proxy/respond"
)

// maxAuthority bounds the normalised host:port a route is looked up by.
const maxAuthority = 300

// serve is the request path: framing checks, the target, admission, then
// the exchange (a tunnel for CONNECT).
func (e *Egress) serve(ctx *fasthttp.RequestCtx) {
	tb := e.table.Load()
	if tb == nil {
		respond.Error(ctx, fasthttp.StatusServiceUnavailable, "egress is not configured")
		return
	}
	h := &ctx.Request.Header
	if err := httpwire.CheckVersion(h.Protocol()); err != nil {
		e.refuse(ctx, fasthttp.StatusHTTPVersionNotSupported, "request refused: "+err.Error())
		return
	}
	scan, err := httpwire.ScanRequestHeaders(h.RawHeaders(), tb.tenantHeader)
	if err != nil {
		e.refuse(ctx, fasthttp.StatusBadRequest, "request refused: "+err.Error())
		return
	}
	if h.IsConnect() {
		e.connect(ctx, tb, scan)
		return
	}
	// The target host: from the absolute-form target (HTTP_PROXY), else
	// from Host (origin-form addressed to a target).
	uri := h.RequestURI()
	https := false
	var authority, origin []byte
	if len(uri) > 0 && uri[0] != '/' && uri[0] != '*' {
		scheme, a, o, ok := httpwire.SplitAbsoluteForm(uri)
		if !ok {
			e.refuse(ctx, fasthttp.StatusBadRequest, "request target is neither origin-form nor an http(s) absolute URI")
			return
		}
		https = len(scheme) == 5
		authority, origin = a, o
	} else {
		if scan.Fields&httpwire.HasHost == 0 {
			e.refuse(ctx, fasthttp.StatusBadRequest, "no target host: send an absolute URI or a Host header")
			return
		}
		authority = h.Host()
	}
	var ab [maxAuthority]byte
	hostport, hostLen, ok := httpwire.AppendHostPort(ab[:0], authority, defaultPort(https))
	if !ok {
		e.refuse(ctx, fasthttp.StatusBadRequest, "target host "+strconv.Quote(string(authority))+" is not a host[:port]")
		return
	}
	r := e.route(ctx, tb, hostport, hostLen)
	if r == nil {
		return
	}
	if r.fixed == nil && tb.loops(hostport, hostLen) {
		e.refuse(ctx, fasthttp.StatusBadRequest, "request addressed to the egress listener itself")
		return
	}
	x := getExchange(e, r, ctx.Time())
	now := e.now(ctx)
	x.wait.Reset(ctx.Conn(), e.opts.Clock, x.deadline())
	ref, ok := admit.Admit(&x.wait, &x.adm, &r.Target, tb.caps, scan.Want, "egress", now)
	gone := x.wait.ClientGone()
	x.wait.End()
	if !ok {
		if gone {
			x.clientGone(ctx)
			return
		}
		x.code = e.refuseAdmission(ctx, r, ref, now)
		x.done()
		return
	}
	// The request as the upstream must see it.
	httpwire.StripRequest(h, scan.Fields)
	if origin != nil || len(uri) > 0 && uri[0] != '/' && uri[0] != '*' {
		// authority and origin point into the request line that setOrigin
		// rewrites, so the Host is copied out first.
		h.SetHostBytes(authority)
		setOrigin(h, origin)
	}
	if r.hostHeader != nil {
		h.SetHostBytes(r.hostHeader)
	}
	if r.fixed != nil {
		https = r.fixed.Config().TLS != nil
	}
	e.exchange(ctx, x, e.pool(r, https, hostport), scan.Fields)
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

// now is the request's time for windows and pools: the instant fasthttp
// read when the request arrived, unless a test clock is in charge.
func (e *Egress) now(ctx *fasthttp.RequestCtx) time.Time {
	if e.realClock {
		return ctx.Time()
	}
	return e.opts.Clock.Now()
}

// route finds the route for a normalised authority, or answers the 403
// for a host no target lists (when unlisted hosts are refused) and returns
// nil.
func (e *Egress) route(ctx *fasthttp.RequestCtx, tb *table, hostport []byte, hostLen int) *route {
	r := tb.lookup(hostport, hostLen)
	if r == nil {
		respond.Unlisted(ctx, hostport[:hostLen])
		e.stats.Reject(respond.ControlUnlisted, "egress")
		e.stats.Target(unlistedName).Done(fasthttp.StatusForbidden, ctx.Time())
	}
	return r
}

// refuse answers a request that was not understood, before any target was
// chosen (also one the listener could not read: a malformed head or
// framing), and counts it as an unlisted host's.
func (e *Egress) refuse(ctx *fasthttp.RequestCtx, status int, msg string) {
	respond.Error(ctx, status, msg)
	e.stats.Target(unlistedName).Done(status, ctx.Time())
}

// refuseAdmission writes the refusal of a control and counts it.
func (e *Egress) refuseAdmission(ctx *fasthttp.RequestCtx, r *route, ref admit.Refusal, now time.Time) int {
	if errors.Is(ref.Err, context.DeadlineExceeded) {
		// The target's timeout passed while the request waited in a pool.
		r.Stats.Reject(respond.ControlTimeout, r.Name)
		return respond.Upstream(ctx, r.Name, &connpool.Error{Kind: connpool.KindTimeout, Op: "wait in", Addr: "pool " + ref.Scope, Err: ref.Err})
	}
	r.Stats.Reject(ref.Control, ref.Scope)
	switch {
	case ref.ByTenantCap():
		respond.Tenant(ctx, ref.Tenant, now)
		return fasthttp.StatusTooManyRequests
	case ref.Control == respond.ControlBreaker:
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

// loops reports whether a request for hostport would come back to this
// listener.
func (tb *table) loops(hostport []byte, hostLen int) bool {
	return httpwire.SelfAddressed(tb.self, hostport, hostLen)
}
