package ingress

import (
	"bytes"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warden-dev/warden/connpool"
	"github.com/warden-dev/warden/governor/control"
	"github.com/warden-dev/warden/proxy/clientwait"
	"github.com/warden-dev/warden/proxy/forward"
	"github.com/warden-dev/warden/proxy/httpwire"
	"github.com/warden-dev/warden/proxy/respond"
	"github.com/warden-dev/warden/proxy/stats"
)

// forwardedMethods is what the ingress passes to the worker, for Allow.
const forwardedMethods = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, TRACE"

// handle serves a request. One refused from its head, its body unread,
// closes with a linger when more of the body may follow than fasthttp
// drops by itself, so that the client sees the refusal, not a reset.
func (g *Ingress) handle(ctx *fasthttp.RequestCtx) {
	if !g.serve(ctx) {
		g.tunnels.LingerUnread(ctx)
	}
}

// serve is the request path: framing checks, Max-Forwards, tenant cap,
// request ID, then the mounted handler or the worker. It reports whether
// the request went on to them, which take its body; a refusal leaves it
// unread.
func (g *Ingress) serve(ctx *fasthttp.RequestCtx) (went bool) {
	rt := g.rt.Load()
	if rt == nil {
		respond.Error(ctx, fasthttp.StatusServiceUnavailable, "ingress is not configured")
		return false
	}
	start := ctx.Time()
	scan, mounted, target, ok := g.check(ctx, rt, start)
	if !ok {
		return false
	}
	// Answered before the tenant cap, as a framing refusal is: the request
	// reaches no worker. expect leaves it to here: it changes the header.
	if code := respond.MaxForwards(ctx, scan.Fields, forwardedMethods); code != 0 {
		target.Done(code, start)
		return false
	}
	// A request that asked before sending its body was counted against its
	// tenant by expect.
	if !ctx.Request.MayContinue() && !g.capTenant(ctx, rt, scan.Want, target, start) {
		return false
	}
	h := &ctx.Request.Header
	if scan.Fields&httpwire.HasRequestID == 0 {
		var id [32]byte
		h.SetBytesV("X-Request-Id", g.ids.Append(id[:0]))
	}
	if mounted != nil {
		g.serveMounted(ctx, rt, mounted)
		return true
	}
	g.forward(ctx, rt, scan.Fields)
	return true
}

// expect answers a request that asks to be told before it sends its body
// (Expect: 100-continue; curl asks for bodies over 1 MiB): the checks that
// need no body run now, so that a refusal, a tenant's 429 above all, goes
// out before the client uploads a body only to have it dropped. fasthttp
// sends the refusal as it is and closes the connection, which the client
// may already be sending the body on.
func (g *Ingress) expect(ctx *fasthttp.RequestCtx) int {
	rt := g.rt.Load()
	if rt == nil {
		return fasthttp.StatusContinue // serve answers 503
	}
	// fasthttp stamps the request's time (ctx.Time) after this call.
	start := time.Now()
	scan, _, target, ok := g.check(ctx, rt, start)
	if !ok || !g.capTenant(ctx, rt, scan.Want, target, start) {
		return ctx.Response.StatusCode()
	}
	return fasthttp.StatusContinue
}

// check runs the checks a request's head decides but the tenant cap
// (capTenant), and answers (and counts) a refusal itself; the request
// arrived at start. It returns what the header scan found, the mount for
// the runs API, and the target the request is counted under: the run
// API's (scheduler) or the worker's.
func (g *Ingress) check(ctx *fasthttp.RequestCtx, rt *policyState, start time.Time) (httpwire.Scan, *mount, *stats.Target, bool) {
	h := &ctx.Request.Header
	m := g.mount.Load()
	if m != nil && !m.matches(requestPath(h.RequestURI())) {
		m = nil
	}
	target := rt.target
	if m != nil {
		target = rt.mounted
	}
	if err := httpwire.CheckVersion(h.Protocol()); err != nil {
		respond.Error(ctx, fasthttp.StatusHTTPVersionNotSupported, "request refused: "+err.Error())
		ctx.SetConnectionClose()
		target.Done(fasthttp.StatusHTTPVersionNotSupported, start)
		return httpwire.Scan{}, nil, nil, false
	}
	scan, err := httpwire.ScanRequestHeaders(h.RawHeaders(), rt.tenantHeader)
	if err == nil && scan.Fields&httpwire.HasHost == 0 && h.IsHTTP11() {
		err = httpwire.ErrMissingHost
	}
	if err != nil {
		respond.Error(ctx, fasthttp.StatusBadRequest, "request refused: "+err.Error())
		target.Done(fasthttp.StatusBadRequest, start)
		return httpwire.Scan{}, nil, nil, false
	}
	if h.IsConnect() {
		// A reverse proxy opens no tunnels: passed on, the worker's 2xx
		// would tell the client its connection is now a tunnel.
		respond.Error(ctx, fasthttp.StatusMethodNotAllowed, "request refused: CONNECT opens no tunnel through the ingress")
		ctx.Response.Header.Set(fasthttp.HeaderAllow, forwardedMethods)
		ctx.SetConnectionClose()
		target.Done(fasthttp.StatusMethodNotAllowed, start)
		return httpwire.Scan{}, nil, nil, false
	}
	return scan, m, target, true
}

// capTenant counts the request against the tenant named by want, when the
// ingress has a tenant cap, and answers (and counts under target) the 429
// when it is over.
func (g *Ingress) capTenant(ctx *fasthttp.RequestCtx, rt *policyState, want []byte, target *stats.Target, start time.Time) bool {
	if rt.caps == nil {
		return true
	}
	now := g.now(start)
	if res := rt.caps.Check(want, now); !res.Allowed {
		respond.Tenant(ctx, res, now)
		g.stats.Reject(res.Control(), "ingress")
		target.Done(fasthttp.StatusTooManyRequests, start)
		return false
	}
	return true
}

// now is the request's time for the tenant windows: the instant it
// arrived, already read, unless a test clock is in charge.
func (g *Ingress) now(arrived time.Time) time.Time {
	if g.realClock {
		return arrived
	}
	return g.opts.Clock.Now()
}

func (g *Ingress) serveMounted(ctx *fasthttp.RequestCtx, rt *policyState, m *mount) {
	if err := forward.ReadAll(ctx, m.maxBody); err != nil {
		if errors.Is(err, forward.ErrTooLarge) {
			// A 400, not a 413: the run API refuses only with 400s and the
			// tenant's 429 (SPEC §6), and words it as the scheduler words
			// its own body errors. It goes at once; the rest of the body
			// is read and dropped after it, so the client sees it, not a
			// reset.
			respond.Error(ctx, fasthttp.StatusBadRequest, tooLarge(ctx, m.maxBody))
			g.tunnels.Linger(ctx)
		} else {
			respond.Error(ctx, fasthttp.StatusBadRequest, err.Error())
		}
	} else {
		// The run API's answers are warden's own: a Reset header is the
		// one fasthttp writes its Date on (respond's answers get theirs
		// the same way).
		ctx.Response.Header.Reset()
		ctx.Response.Header.SetNoDefaultContentType(true)
		m.h(ctx)
	}
	rt.mounted.Done(ctx.Response.StatusCode(), ctx.Time())
}

// tooLarge is the message for a mounted request's body over limit: its
// size when the request announced it, else that it goes past the limit.
func tooLarge(ctx *fasthttp.RequestCtx, limit int) string {
	n := ctx.Request.Header.ContentLength()
	if !ctx.Request.IsBodyStream() {
		n = len(ctx.Request.Body())
	}
	if n > limit {
		return "body is " + strconv.Itoa(n) + " bytes; the limit is " + strconv.Itoa(limit)
	}
	return "body is over " + strconv.Itoa(limit) + " bytes; the limit is " + strconv.Itoa(limit)
}

func (m *mount) matches(path []byte) bool {
	if !bytes.HasPrefix(path, []byte(m.prefix)) {
		return false
	}
	rest := path[len(m.prefix):]
	return len(rest) == 0 || rest[0] == '/'
}

// requestPath is the path of a request target, absolute-form included.
func requestPath(uri []byte) []byte {
	if len(uri) > 0 && uri[0] != '/' {
		if _, _, origin, ok := httpwire.SplitAbsoluteForm(uri); ok {
			uri = origin
		}
	}
	if i := bytes.IndexByte(uri, '?'); i >= 0 {
		uri = uri[:i]
	}
	return uri
}

// exchange is the state of one request forwarded to the worker; it
// outlives the handler when the response body is streamed.
type exchange struct {
	body forward.Body
	// guard gives the exchange up when its client hangs up before the
	// worker answers; kept, with its timer, across reuses.
	guard  clientwait.Guard
	req    connpool.Request
	target *stats.Target
	start  time.Time
	code   int
}

var exchanges = sync.Pool{New: func() any { return new(exchange) }}

// Finish ends a streamed response (connpool.Finisher).
func (x *exchange) Finish(error) { x.done() }

func (x *exchange) done() {
	x.target.Done(x.code, x.start)
	x.body.Release()
	x.req = connpool.Request{}
	x.target = nil
	exchanges.Put(x)
}

func (g *Ingress) forward(ctx *fasthttp.RequestCtx, rt *policyState, f httpwire.Fields) {
	h := &ctx.Request.Header
	upgrade := httpwire.StripRequestKeepingUpgrade(h, f)
	httpwire.SetForwarded(h, f, ctx.RemoteAddr())
	if uri := h.RequestURI(); len(uri) > 0 && uri[0] != '/' && uri[0] != '*' {
		if _, _, origin, ok := httpwire.SplitAbsoluteForm(uri); ok {
			if len(origin) == 0 || origin[0] == '?' {
				h.SetRequestURIBytes(append([]byte{'/'}, origin...))
			} else {
				h.SetRequestURIBytes(origin)
			}
		}
	}
	x := exchanges.Get().(*exchange)
	x.target, x.start = rt.target, ctx.Time()
	x.req.Header = h
	x.req.Upgrade = upgrade
	if rt.timeout > 0 {
		x.req.Deadline = x.start.Add(rt.timeout)
	}
	// The worker's pool has no max_connections, so the request never
	// waits for a connection and needs no x.req.Wait.
	if _, err := x.body.Prepare(ctx, &x.req, 0); err != nil {
		g.refuseBody(ctx, x, err)
		return
	}
	x.guard.Start(g.opts.Clock, ctx.Conn(), &x.req)
	streamed, err := rt.worker.Do(&x.req, &ctx.Response, x)
	if x.guard.Stop(err) {
		// Nobody is there to answer: closed with nothing written, and
		// counted as nginx counts it.
		ctx.SetConnectionClose()
		x.code = clientwait.StatusGone
		x.done()
		return
	}
	if err != nil {
		if connpool.KindOf(err) == connpool.KindClient {
			g.refuseBody(ctx, x, err)
			return
		}
		x.code = respond.Upstream(ctx, "worker", err)
		_, ctl := respond.UpstreamStatus(err)
		g.stats.Reject(ctl, "worker")
		g.opts.Log.Debug("ingress: worker exchange failed", "err", err)
		x.done()
		return
	}
	if x.req.Switched != nil {
		g.switchProtocols(ctx, x)
		return
	}
	httpwire.StripResponse(&ctx.Response.Header)
	x.code = ctx.Response.StatusCode()
	if x.req.StreamLeft() {
		g.tunnels.Linger(ctx)
	}
	if !streamed {
		x.done()
		return
	}
	// x is done once the stream is closed: only ctx is used after this.
	if err := forward.FrameForHTTP10(ctx, &x.code); err != nil {
		respond.Upstream(ctx, "worker", err)
		g.stats.Reject(control.Upstream, "worker")
	}
}

// refuseBody ends an exchange whose client's body could not be read
// (forward.RefuseBody); ingress.timeout passing counts as the worker's
// timeout.
func (g *Ingress) refuseBody(ctx *fasthttp.RequestCtx, x *exchange, err error) {
	var timedOut bool
	x.code, timedOut = forward.RefuseBody(ctx, "worker", "ingress.timeout", err)
	if timedOut {
		g.stats.Reject(control.Timeout, "worker")
	}
	x.done()
}

// switchProtocols passes on the worker's 101 Switching Protocols and joins
// the client's connection to the worker's until both are done (a
// WebSocket): bytes pass unread both ways, each side's end of stream
// reaching the other. The request is counted with its 101 now; the
// tunnel holds no window or slot, and a drain waits for it until
// shutdown_grace, then cuts it.
func (g *Ingress) switchProtocols(ctx *fasthttp.RequestCtx, x *exchange) {
	x.code = fasthttp.StatusSwitchingProtocols
	if !g.tunnels.Hijack(ctx, x.req.Switched, nil) {
		respond.Error(ctx, fasthttp.StatusServiceUnavailable, "ingress is shutting down")
		x.code = fasthttp.StatusServiceUnavailable
	}
	x.done()
}

// refuseUnread answers a request the listener could not read (a malformed
// head or framing) and counts it as the worker's, like the refusals serve
// answers.
func (g *Ingress) refuseUnread(ctx *fasthttp.RequestCtx, status int, msg string) {
	respond.Error(ctx, status, msg)
	g.stats.Target("worker").Done(status, ctx.Time())
}
