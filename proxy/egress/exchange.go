package egress

import (
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warden-dev/warden/connpool"
	"github.com/warden-dev/warden/governor/breaker"
	"github.com/warden-dev/warden/governor/control"
	"github.com/warden-dev/warden/governor/retry"
	"github.com/warden-dev/warden/internal/rawio"
	"github.com/warden-dev/warden/proxy/admit"
	"github.com/warden-dev/warden/proxy/clientwait"
	"github.com/warden-dev/warden/proxy/forward"
	"github.com/warden-dev/warden/proxy/httpwire"
	"github.com/warden-dev/warden/proxy/respond"
)

// RetryBodyMax is the largest request body kept for a retry; a longer body
// is streamed once and its request is not retried.
const RetryBodyMax = 1 << 20

// WholeFailureMax is the longest failure response read whole so that its
// request can be retried, whatever its framing; a longer one (or one whose
// end is the connection's close) is streamed to the client and not retried.
const WholeFailureMax = connpool.WholeBodyMax

// reasonMax is how much of a failed response's body the non_retryable
// filter reads (SPEC §4: status line plus the first 4 KiB of the body).
const reasonMax = 4 << 10

// exchange is the state of one admitted request; it outlives the handler
// when the response body is streamed.
type exchange struct {
	e    *Egress
	r    *route
	adm  admit.Admission
	wait clientwait.Wait
	// guard gives the exchange up when its client hangs up while it is
	// sent or its answer awaited; kept, with its timer, across reuses.
	guard *clientwait.Guard
	body  forward.Body
	req   connpool.Request
	start time.Time
	code  int
	// streaming is the breaker ticket of a success whose body is still
	// being streamed: its outcome is known only when the body ends.
	streaming breaker.Ticket
}

var exchanges = sync.Pool{New: func() any { return new(exchange) }}

func getExchange(e *Egress, r *route, start time.Time) *exchange {
	x := exchanges.Get().(*exchange)
	x.e, x.r, x.start = e, r, start
	return x
}

// Finish ends a streamed response (connpool.Finisher). A body the upstream
// broke off, or that the timeout cut, makes the exchange a failure however
// its status began; one the client stopped reading says nothing of the
// upstream.
func (x *exchange) Finish(err error) {
	outcome := breaker.Success
	if err != nil {
		outcome = breaker.Neutral
		switch connpool.KindOf(err) {
		case connpool.KindTimeout:
			outcome = breaker.Failure
			x.r.Stats.Reject(control.Timeout, x.r.Name)
		case connpool.KindUpstream:
			outcome = breaker.Failure
			x.r.Stats.Reject(control.Upstream, x.r.Name)
		}
	}
	x.streaming.Done(outcome)
	x.done()
}

// done releases what the request held and records it.
func (x *exchange) done() {
	x.wait.End()
	x.adm.Release()
	x.r.Stats.Done(x.code, x.start)
	x.body.Release()
	*x = exchange{body: x.body, guard: x.guard}
	exchanges.Put(x)
}

// exchange sends the admitted request, retrying failures of idempotent
// requests (or requests with an Idempotency-Key) as the target's retry
// policy and budget allow, all within the target's timeout.
func (e *Egress) exchange(ctx *fasthttp.RequestCtx, x *exchange, pool *connpool.Pool, f httpwire.Fields) {
	r := x.r
	h := &ctx.Request.Header
	// A request that may switch protocols goes once: what follows a 101
	// is not HTTP, and cannot be sent again.
	retryable := r.Retry != nil && !x.req.Upgrade && (httpwire.Idempotent(h.Method()) || sendsIdempotencyKey(h, f))
	keep := 0
	if retryable {
		keep = RetryBodyMax
	}
	x.req.Header = h
	// From the request's arrival: the timeout bounds the whole exchange,
	// waiting in a pool and reading the client's body (Prepare) included.
	x.req.Deadline = x.deadline()
	// A wait for an upstream connection ends when the client hangs up,
	// not when a drain begins: in-flight requests finish within the grace.
	x.wait.Reset(ctx.Conn(), e.opts.Clock, x.req.Deadline)
	x.req.Wait = &x.wait
	buffered, err := x.body.Prepare(ctx, &x.req, keep)
	if err == nil && r.Timeout > 0 && !time.Now().Before(x.req.Deadline) {
		err = forward.ErrBodyTimeout
	}
	if err != nil {
		// Used up before anything was sent: the upstream is not to
		// blame, so the breaker hears nothing.
		x.adm.Ticket.Done(breaker.Neutral)
		x.refuseBody(ctx, err)
		return
	}
	retryable = retryable && buffered
	if retryable {
		x.req.Whole = isFailure
	}
	if r.Retry != nil {
		r.Retry.RecordExecution()
	}
	ticket := x.adm.Ticket
	if x.guard == nil {
		x.guard = new(clientwait.Guard)
	}
	for attempt := 1; ; attempt++ {
		x.guard.Start(e.opts.Clock, ctx.Conn(), &x.req)
		streamed, err := pool.Do(&x.req, &ctx.Response, x)
		gone := x.guard.Stop(err)
		var again bool
		if err != nil {
			if connpool.KindOf(err) == connpool.KindClient {
				ticket.Done(breaker.Neutral)
				if gone || x.wait.ClientGone() {
					x.clientGone(ctx)
					return
				}
				// The client's body failed on its way upstream: a
				// client slower than the target's timeout, or than the
				// listener's body_idle, is not the upstream's doing.
				x.refuseBody(ctx, err)
				return
			}
			outcome := blame(ctx, breaker.Failure)
			ticket.Done(outcome)
			_, ctl := respond.UpstreamStatus(err)
			if retryable && ctl != control.Timeout && outcome == breaker.Failure {
				var refused control.Name
				ticket, again, refused = e.retry(ctx, x, attempt, err.Error(), 0)
				if refused != "" {
					ctl = refused
				}
			}
			if !again {
				x.code = respond.UpstreamAs(ctx, r.Name, err, ctl)
				r.Stats.Reject(ctl, r.Name)
				x.done()
				return
			}
		} else if x.req.Switched != nil {
			ticket.Done(breaker.Success)
			e.switchProtocols(ctx, x)
			return
		} else {
			status := ctx.Response.StatusCode()
			outcome := blame(ctx, breaker.ClassifyHTTP(status))
			if streamed && outcome == breaker.Success {
				x.streaming = ticket
			} else {
				ticket.Done(outcome)
			}
			x.code = status
			var refused control.Name
			if outcome == breaker.Failure && retryable && !streamed {
				ticket, again, refused = e.retry(ctx, x, attempt, failureReason(&ctx.Response), e.retryAfter(&ctx.Response))
			}
			if !again {
				// Only the answer that goes to the client is stripped: a
				// header given a Date (StripResponse) stays Reset, which
				// would have the next attempt's own Date replaced. It is
				// marked after, as the header is read back then.
				httpwire.StripResponse(&ctx.Response.Header)
				if refused != "" {
					respond.MarkControl(&ctx.Response.Header, refused)
					r.Stats.Reject(refused, r.Name)
				}
				if x.req.StreamLeft() {
					e.tunnels.Linger(ctx)
				}
				if !streamed {
					x.done()
					return
				}
				// x is done once the stream is closed: only ctx and r
				// are used after this.
				if err := forward.FrameForHTTP10(ctx, &x.code); err != nil {
					respond.Upstream(ctx, r.Name, err)
					r.Stats.Reject(control.Upstream, r.Name)
				}
				return
			}
		}
	}
}

// deadline is when the target's timeout ends the exchange (zero: never).
func (x *exchange) deadline() time.Time {
	if x.r.Timeout <= 0 {
		return time.Time{}
	}
	return x.start.Add(x.r.Timeout)
}

// refuseBody ends an exchange whose client's body could not be read
// (forward.RefuseBody); the target's timeout passing counts as its timeout.
func (x *exchange) refuseBody(ctx *fasthttp.RequestCtx, err error) {
	var timedOut bool
	x.code, timedOut = forward.RefuseBody(ctx, x.r.Name, "the target's timeout", err)
	if timedOut {
		x.r.Stats.Reject(control.Timeout, x.r.Name)
	}
	x.done()
}

// clientGone ends an exchange whose client hung up before its answer
// (while it waited, or while the upstream was asked): nobody is there to
// answer, so no refusal is counted, and the connection is closed with
// nothing written.
func (x *exchange) clientGone(ctx *fasthttp.RequestCtx) {
	ctx.SetConnectionClose()
	x.code = clientwait.StatusGone
	x.done()
}

// isFailure reports whether an answer with status is a failure, one a
// retry may follow.
func isFailure(status int) bool { return breaker.ClassifyHTTP(status) == breaker.Failure }

// blame is the breaker's outcome of an attempt: o, unless o is a failure
// the client did not wait for (it closed its connection while the upstream
// was being asked: its own timeout, a cancelled call). That says as much
// about the client as about the upstream, so it is neutral, and not
// retried. Only failures are checked: the check is a system call, and a
// success the client left behind still shows the upstream working.
func blame(ctx *fasthttp.RequestCtx, o breaker.Outcome) breaker.Outcome {
	if o == breaker.Failure && rawio.Peek(ctx.Conn()) == rawio.PeekClosed {
		return breaker.Neutral
	}
	return o
}

// sendsIdempotencyKey reports whether the request, as stripped for the
// upstream, still carries its Idempotency-Key: a Connection header naming
// it has removed it, and a request the upstream sees without its key is
// not safe to send twice.
func sendsIdempotencyKey(h *fasthttp.RequestHeader, f httpwire.Fields) bool {
	if f&httpwire.HasIdempotencyKey == 0 {
		return false
	}
	return f&httpwire.HasConnection == 0 || len(h.Peek("Idempotency-Key")) > 0
}

// retry decides whether to retry after failed attempt number attempt
// (1-based), with the policy's delay lengthened to what the upstream asked
// (admit.Retry), and readies the response for the retry's answer. Until
// it returns true the response holds the failure, which is what the
// client gets when there is no retry.
func (e *Egress) retry(ctx *fasthttp.RequestCtx, x *exchange, attempt int, reason string, asked time.Duration) (ticket breaker.Ticket, again bool, refused control.Name) {
	// x.wait ends when the client hangs up or the timeout passes.
	ticket, again, refused = admit.Retry(&x.wait, &x.r.Target, e.opts.Clock, attempt, reason, x.r.Retry.DelayAsked(attempt, asked))
	if again {
		ctx.Response.Reset()
		// Reset turns fasthttp's default Content-Type back on; the next
		// answer must go to the client as the upstream sent it.
		ctx.Response.Header.SetNoDefaultContentType(true)
	}
	return ticket, again, refused
}

// retryAfter is the wait a 429 or 503 asked for in its Retry-After (0:
// none). A retry sooner would meet the same refusal, and spend the target's
// goodwill and the retry budget on it: the retry waits that long, up to
// the policy's max_delay, and is not made when the target's timeout would
// pass first (Envoy's rate_limited_retry_back_off does as much).
func (e *Egress) retryAfter(resp *fasthttp.Response) time.Duration {
	return retry.Asked(resp.StatusCode(), string(resp.Header.Peek(fasthttp.HeaderRetryAfter)), e.opts.Clock.Now())
}

// failureReason is what non_retryable entries are matched against: the
// status line and the first 4 KiB of the body.
func failureReason(resp *fasthttp.Response) string {
	b := make([]byte, 0, 64+min(len(resp.Body()), reasonMax))
	b = append(b, "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(resp.StatusCode()), 10)
	b = append(b, ' ')
	b = append(b, resp.Header.StatusMessage()...)
	b = append(b, '\n')
	body := resp.Body()
	b = append(b, body[:min(len(body), reasonMax)]...)
	return string(b)
}
