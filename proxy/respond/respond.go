// Package respond writes the responses warden itself produces on the HTTP
// listeners: every refusal names its control (SPEC §4) in the
// x-warden-control header and in the JSON body's "control" field, with
// Retry-After in whole seconds where waiting helps. What a refusal says is
// governor/control's; how it goes on the wire over fasthttp is here.
package respond

import (
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warden-dev/warden/connpool"
	"github.com/warden-dev/warden/governor/control"
	"github.com/warden-dev/warden/governor/pool"
	"github.com/warden-dev/warden/governor/tenant"
	"github.com/warden-dev/warden/internal/jsonstr"
	"github.com/warden-dev/warden/proxy/httpwire"
)

// MarkControl names c on a response that passes through (an upstream
// failure returned as is when the retry budget is spent), spelt as the
// responses written here spell it.
func MarkControl(h *fasthttp.ResponseHeader, c control.Name) {
	h.DisableNormalizing()
	h.Set(control.Header, string(c))
	h.EnableNormalizing()
}

// begin resets whatever an upstream attempt left in the response.
func begin(ctx *fasthttp.RequestCtx, status int, c control.Name) {
	ctx.Response.Reset()
	// Header names go out as SPEC §4 spells them (x-warden-control,
	// RateLimit-Limit), not as fasthttp would recase them
	// (X-Warden-Control, Ratelimit-Limit): names are case-insensitive, but
	// a client that greps for them should find them. Reset turns
	// recasing back on for the next response.
	ctx.Response.Header.DisableNormalizing()
	ctx.Response.SetStatusCode(status)
	ctx.Response.Header.SetContentType("application/json")
	if c != "" {
		ctx.Response.Header.Set(control.Header, string(c))
	}
}

func setInt(h *fasthttp.ResponseHeader, key string, v int64) {
	var b [20]byte
	h.SetBytesV(key, strconv.AppendInt(b[:0], v, 10))
}

// Refuse writes the refusal r with status: x-warden-control, then
// Retry-After when waiting helps, then the RateLimit fields when a window
// was counted, and r's JSON body (control.Refusal.AppendBody).
func Refuse(ctx *fasthttp.RequestCtx, status int, r *control.Refusal) {
	begin(ctx, status, r.Control)
	h := &ctx.Response.Header
	if r.RetryAfter > 0 {
		setInt(h, control.HeaderRetryAfter, r.RetryAfter)
	}
	if r.Counted {
		setInt(h, control.HeaderLimit, r.Limit)
		setInt(h, control.HeaderRemaining, r.Remaining)
		setInt(h, control.HeaderReset, r.RetryAfter)
	}
	var buf [160]byte
	ctx.Response.SetBody(r.AppendBody(buf[:0])) // copied: buf may stay on the stack
}

// Tenant writes SPEC §4's tenant 429 (tenant.Result.Refusal). When a
// fail_closed shared backend is down the control is upstream, and the
// RateLimit fields are left out: nothing was counted, so they would
// report a quota that was never looked at.
func Tenant(ctx *fasthttp.RequestCtx, r tenant.Result, now time.Time) {
	ref := r.Refusal(now)
	Refuse(ctx, fasthttp.StatusTooManyRequests, &ref)
}

// Breaker writes the open-breaker 503:
// {"control":"circuit_breaker","target":"stripe","retryAfterSeconds":N}.
func Breaker(ctx *fasthttp.RequestCtx, target string, retryAfter time.Duration) {
	Refuse(ctx, fasthttp.StatusServiceUnavailable, &control.Refusal{
		Control: control.CircuitBreaker, Target: target, RetryAfter: control.RetryAfterSeconds(retryAfter)})
}

// Pool writes a pool's 429:
// {"control":"pool_queue","pool":"stripe","target":"stripe","retryAfterSeconds":N}.
// Retry-After is the time to the rate window's end, or 1 s when the pool
// was full on concurrency (a slot frees when any request ends).
func Pool(ctx *fasthttp.RequestCtx, rej *pool.Rejection, target string) {
	Refuse(ctx, fasthttp.StatusTooManyRequests, &control.Refusal{
		Control: rej.Control, Pool: rej.Pool, Target: target, RetryAfter: control.RetryAfterSeconds(rej.RetryAfter)})
}

// UpstreamStatus is the status and control an upstream failure is answered
// with: 504 timeout for an exchange past its deadline, 502 upstream for
// anything else the upstream did.
func UpstreamStatus(err error) (int, control.Name) {
	if connpool.KindOf(err) == connpool.KindTimeout {
		return fasthttp.StatusGatewayTimeout, control.Timeout
	}
	return fasthttp.StatusBadGateway, control.Upstream
}

// Upstream writes the 502/504 for a failed exchange with target:
// {"control":"upstream","target":"worker","error":"dial 127.0.0.1:9000: connection refused"}.
// It returns the status written.
func Upstream(ctx *fasthttp.RequestCtx, target string, err error) int {
	_, c := UpstreamStatus(err)
	return UpstreamAs(ctx, target, err, c)
}

// UpstreamAs is Upstream naming c as the cause: the failure is the
// upstream's, but what ended the request was another control (a spent
// retry budget).
func UpstreamAs(ctx *fasthttp.RequestCtx, target string, err error, c control.Name) int {
	status, _ := UpstreamStatus(err)
	Refuse(ctx, status, &control.Refusal{Control: c, Target: target, Error: err.Error()})
	return status
}

// unlistedError is the error of the 403 for an unlisted host.
const unlistedError = "no target lists this host and egress.allow_unlisted is false"

// Unlisted writes the 403 for a host no target matches when unlisted hosts
// are refused.
func Unlisted(ctx *fasthttp.RequestCtx, host []byte) {
	Refuse(ctx, fasthttp.StatusForbidden, &control.Refusal{Control: control.AllowUnlisted, Host: string(host), Error: unlistedError})
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
