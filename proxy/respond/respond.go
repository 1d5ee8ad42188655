// Package respond writes the responses warden itself produces on the HTTP
// listeners: every refusal names its control (SPEC §4) in the
// x-warden-control header and in the JSON body's "control" field, with
// Retry-After in whole seconds where waiting helps.
package respond

import (
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warden-dev/warden/connpool"
	"github.com/warden-dev/warden/governor/breaker"
	"github.com/warden-dev/warden/governor/pool"
	"github.com/warden-dev/warden/governor/tenant"
	"github.com/warden-dev/warden/internal/jsonstr"
	"github.com/warden-dev/warden/proxy/httpwire"
)

// HeaderControl names the control that refused or shaped a response.
const HeaderControl = "x-warden-control"

// MarkControl names control on a response that passes through (an
// upstream failure returned as is when the retry budget is spent), spelt
// as the responses written here spell it.
func MarkControl(h *fasthttp.ResponseHeader, control string) {
	h.DisableNormalizing()
	h.Set(HeaderControl, control)
	h.EnableNormalizing()
}

// Control names used here beyond the governor's own (SPEC §4).
const (
	// ControlBreaker is the breaker's own, named here beside the others
	// the responses carry.
	ControlBreaker  = breaker.Control
	ControlUpstream = "upstream"
	ControlTimeout  = "timeout"
	// ControlUnlisted refuses hosts no target matches when
	// egress.allow_unlisted is false; it is named after that key.
	ControlUnlisted = "allow_unlisted"
)

// begin resets whatever an upstream attempt left in the response.
func begin(ctx *fasthttp.RequestCtx, status int, control string) {
	ctx.Response.Reset()
	// Header names go out as SPEC §4 spells them (x-warden-control,
	// RateLimit-Limit), not as fasthttp would recase them
	// (X-Warden-Control, Ratelimit-Limit): names are case-insensitive, but
	// a client that greps for them should find them. Reset turns
	// recasing back on for the next response.
	ctx.Response.Header.DisableNormalizing()
	ctx.Response.SetStatusCode(status)
	ctx.Response.Header.SetContentType("application/json")
	if control != "" {
		ctx.Response.Header.Set(HeaderControl, control)
	}
}

func setInt(h *fasthttp.ResponseHeader, key string, v int64) {
	var b [20]byte
	h.SetBytesV(key, strconv.AppendInt(b[:0], v, 10))
}

// Tenant writes SPEC §4's tenant 429: Retry-After, RateLimit-Limit,
// RateLimit-Remaining, RateLimit-Reset, x-warden-control: tenant_rate and
// {"control":"tenant_rate","quota":...,"limit":...,"current":...,"retryAfterSeconds":...}.
// When a fail_closed shared backend is down the control is upstream, and
// the RateLimit fields are left out: nothing was counted, so they would
// report a quota that was never looked at.
func Tenant(ctx *fasthttp.RequestCtx, r tenant.Result, now time.Time) {
	begin(ctx, fasthttp.StatusTooManyRequests, r.Control())
	h := &ctx.Response.Header
	secs := int64(r.RetryAfter(now))
	setInt(h, fasthttp.HeaderRetryAfter, secs)
	if !r.Unavailable {
		setInt(h, "RateLimit-Limit", r.Limit)
		setInt(h, "RateLimit-Remaining", r.Remaining())
		setInt(h, "RateLimit-Reset", secs)
	}
	var buf [160]byte
	ctx.Response.SetBody(r.AppendBody(buf[:0], now)) // copied: buf may stay on the stack
}

// Breaker writes the open-breaker 503:
// {"control":"circuit_breaker","target":"stripe","retryAfterSeconds":N}.
func Breaker(ctx *fasthttp.RequestCtx, target string, retryAfter time.Duration) {
	secs := int64(breaker.RetryAfterSeconds(retryAfter))
	begin(ctx, fasthttp.StatusServiceUnavailable, ControlBreaker)
	setInt(&ctx.Response.Header, fasthttp.HeaderRetryAfter, secs)
	body := append(make([]byte, 0, 96), `{"control":"circuit_breaker","target":`...)
	body = jsonstr.Append(body, target)
	body = append(body, `,"retryAfterSeconds":`...)
	body = strconv.AppendInt(body, secs, 10)
	ctx.Response.SetBodyRaw(append(body, '}'))
}

// Pool writes a pool's 429:
// {"control":"pool_queue","pool":"stripe","target":"stripe","retryAfterSeconds":N}.
// Retry-After is the time to the rate window's end, or 1 s when the pool
// was full on concurrency (a slot frees when any request ends).
func Pool(ctx *fasthttp.RequestCtx, rej *pool.Rejection, target string) {
	secs := int64(breaker.RetryAfterSeconds(rej.RetryAfter))
	begin(ctx, fasthttp.StatusTooManyRequests, rej.Control)
	setInt(&ctx.Response.Header, fasthttp.HeaderRetryAfter, secs)
	body := append(make([]byte, 0, 128), `{"control":`...)
	body = jsonstr.Append(body, rej.Control)
	body = append(body, `,"pool":`...)
	body = jsonstr.Append(body, rej.Pool)
	body = append(body, `,"target":`...)
	body = jsonstr.Append(body, target)
	body = append(body, `,"retryAfterSeconds":`...)
	body = strconv.AppendInt(body, secs, 10)
	ctx.Response.SetBodyRaw(append(body, '}'))
}

// UpstreamStatus is the status and control an upstream failure is answered
// with: 504 timeout for an exchange past its deadline, 502 upstream for
// anything else the upstream did.
func UpstreamStatus(err error) (int, string) {
	if connpool.KindOf(err) == connpool.KindTimeout {
		return fasthttp.StatusGatewayTimeout, ControlTimeout
	}
	return fasthttp.StatusBadGateway, ControlUpstream
}

// Upstream writes the 502/504 for a failed exchange with target:
// {"control":"upstream","target":"worker","error":"dial 127.0.0.1:9000: connection refused"}.
// It returns the status written.
func Upstream(ctx *fasthttp.RequestCtx, target string, err error) int {
	_, control := UpstreamStatus(err)
	return UpstreamAs(ctx, target, err, control)
}

// UpstreamAs is Upstream naming control as the cause: the failure is the
// upstream's, but what ended the request was another control (a spent
// retry budget).
func UpstreamAs(ctx *fasthttp.RequestCtx, target string, err error, control string) int {
	status, _ := UpstreamStatus(err)
	begin(ctx, status, control)
	body := append(make([]byte, 0, 160), `{"control":`...)
	body = jsonstr.Append(body, control)
	body = append(body, `,"target":`...)
	body = jsonstr.Append(body, target)
	body = append(body, `,"error":`...)
	body = jsonstr.Append(body, err.Error())
	ctx.Response.SetBodyRaw(append(body, '}'))
	return status
}

// Unlisted writes the 403 for a host no target matches when unlisted hosts
// are refused.
func Unlisted(ctx *fasthttp.RequestCtx, host []byte) {
	begin(ctx, fasthttp.StatusForbidden, ControlUnlisted)
	body := append(make([]byte, 0, 128), `{"control":"allow_unlisted","host":`...)
	body = jsonstr.Append(body, string(host))
	body = append(body, `,"error":"no target lists this host and egress.allow_unlisted is false"}`...)
	ctx.Response.SetBodyRaw(body)
}

// Error writes status with {"error":msg}. For 400 and 413 it also closes
// the connection: after a request whose framing was refused nothing else
// on the connection can be trusted, and a body too large to accept is not
// worth reading to its end just to keep the connection.
func Error(ctx *fasthttp.RequestCtx, status int, msg string) {
	begin(ctx, status, "")
	body := append(make([]byte, 0, 64+len(msg)), `{"error":`...)
	body = jsonstr.Append(body, msg)
	ctx.Response.SetBodyRaw(append(body, '}'))
	if status == fasthttp.StatusBadRequest || status == fasthttp.StatusRequestEntityTooLarge {
		ctx.SetConnectionClose()
	}
}

// MaxForwards applies Max-Forwards (httpwire.MaxForwards) to the request
// with header fields f, and answers the request when it ends here: 400 for
// a value that is not one decimal number, or, at 0, as the final
// recipient, where allow lists the methods the listener passes on. It
// returns the status it answered with, or 0 when the request goes on.
func MaxForwards(ctx *fasthttp.RequestCtx, f httpwire.Fields, allow string) int {
	final, err := httpwire.MaxForwards(&ctx.Request.Header, f)
	switch {
	case err != nil:
		Error(ctx, fasthttp.StatusBadRequest, "request refused: "+err.Error())
		return fasthttp.StatusBadRequest
	case final:
		finalRecipient(ctx, allow)
		return fasthttp.StatusOK
	}
	return 0
}

// finalRecipient answers an OPTIONS or TRACE request whose Max-Forwards
// reached 0 at this proxy (RFC 9110 §7.6.2), as the server would: OPTIONS
// with 200 and allow in Allow, TRACE with 200 and the request echoed as
// message/http (RFC 9110 §9.3.8).
func finalRecipient(ctx *fasthttp.RequestCtx, allow string) {
	h := &ctx.Request.Header
	ctx.Response.Reset()
	ctx.Response.SetStatusCode(fasthttp.StatusOK)
	if h.IsTrace() {
		ctx.Response.Header.SetContentType("message/http")
		ctx.Response.SetBodyRaw(httpwire.TraceEcho(h))
		return
	}
	ctx.Response.Header.Set(fasthttp.HeaderAllow, allow)
	ctx.Response.Header.SetNoDefaultContentType(true)
}
