package grpcegress

import (
	"context"
	"errors"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/warden-dev/warden/governor/breaker"
	"github.com/warden-dev/warden/governor/control"
	"github.com/warden-dev/warden/proxy/admit"
)

// gRPC status codes warden itself answers with.
const (
	codeOK                = 0
	codeCancelled         = 1
	codeInvalidArgument   = 3
	codeDeadlineExceeded  = 4
	codePermissionDenied  = 7
	codeResourceExhausted = 8
	codeInternal          = 13
	codeUnavailable       = 14
)

// hopByHop are the connection-specific headers HTTP/2 forbids (RFC 9113
// §8.2.2); Go's HTTP/2 transport refuses requests carrying them. TE is
// handled apart: "trailers" is kept, gRPC requires it.
var hopByHop = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authorization", "Proxy-Authenticate",
	"Transfer-Encoding", "Upgrade", "Trailer"}

func (g *Grpc) serve(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	tb := g.table.Load()
	if tb == nil {
		trailersOnly(w, codeUnavailable, "grpc egress is not configured", "")
		return
	}
	if r.ProtoMajor != 2 {
		http.Error(w, "gRPC needs HTTP/2 (h2c, prior knowledge)", http.StatusHTTPVersionNotSupported)
		return
	}
	if tb.bodyIdle > 0 && r.Body != nil && r.Body != http.NoBody {
		sw := newStallWatch(w, r.Body, tb.bodyIdle, g.stallCount.Inc)
		defer sw.stop()
		r.Body = sw
	}
	rt := tb.lookup(serviceOf(r.URL.Path), r.Host)
	if rt == nil {
		g.stats.Reject(control.AllowUnlisted, "grpc")
		trailersOnly(w, codePermissionDenied, "no target serves "+r.URL.Path+" at "+r.Host+" and egress.allow_unlisted is false", control.AllowUnlisted)
		g.stats.Target(unlistedName).DoneGRPC(codePermissionDenied, start)
		return
	}
	if rt.host == "" && tb.loops(r.Host) {
		trailersOnly(w, codeInvalidArgument, "call addressed to the grpc egress listener itself ("+r.Host+")", "")
		rt.Stats.DoneGRPC(codeInvalidArgument, start)
		return
	}
	var adm admit.Admission
	var tenantKey []byte
	if tb.caps != nil {
		tenantKey = []byte(r.Header.Get(tb.tenantHeader))
	}
	// The timeout bounds the whole call, waiting in a pool included.
	ctx := r.Context()
	if rt.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, rt.Timeout)
		defer cancel()
	}
	now := g.opts.Clock.Now()
	if ref, ok := admit.Admit(ctx, &adm, &rt.Target, tb.caps, tenantKey, "grpc", now); !ok {
		if ref.Err != nil && r.Context().Err() != nil {
			// The client cancelled while queued: nothing was refused and
			// nothing is sent; the call ends as the client ended it.
			trailersOnly(w, codeCancelled, "cancelled by the client while waiting in pool "+ref.Scope, "")
			rt.Stats.DoneGRPC(codeCancelled, start)
			return
		}
		if errors.Is(ref.Err, context.DeadlineExceeded) {
			// Warden's own queue: the breaker was told nothing (Admit gave
			// its ticket back as neutral).
			rt.Stats.Reject(control.Timeout, rt.Name)
			trailersOnly(w, codeDeadlineExceeded, "timeout of "+rt.Name+" passed while waiting in pool "+ref.Scope, control.Timeout)
			rt.Stats.DoneGRPC(codeDeadlineExceeded, start)
			return
		}
		rt.Stats.Reject(ref.Control, ref.Scope)
		code := codeResourceExhausted
		msg := "refused by " + string(ref.Control)
		switch {
		case ref.Control == control.CircuitBreaker:
			code = codeUnavailable
			msg = "circuit breaker of " + rt.Name + " is open; retry after " + strconv.FormatInt(control.RetryAfterSeconds(ref.RetryAfter), 10) + "s"
		case ref.Control == control.Upstream:
			// A fail_closed shared backend that cannot be reached: the
			// limit was never consulted, so naming it as reached would
			// send the operator to the wrong place. RESOURCE_EXHAUSTED,
			// as HTTP gets 429 (SPEC §9).
			msg = "shared limits backend unreachable (on_error: fail_closed); " + ref.Scope + " refused; retry after 1s"
		case ref.ByTenantCap():
			msg = "tenant cap " + ref.Tenant.Quota() + " reached; retry after " + strconv.Itoa(ref.Tenant.RetryAfter(now)) + "s"
		case ref.Err != nil:
			code = codeUnavailable
			msg = "gave up waiting for a pool: " + ref.Err.Error()
		}
		trailersOnly(w, code, msg, ref.Control)
		rt.Stats.DoneGRPC(code, start)
		return
	}
	if r.Context().Err() != nil {
		// Admitted as the client cancelled: its slot goes to a live caller.
		adm.Ticket.Done(breaker.Neutral)
		adm.Release()
		rt.Stats.DoneGRPC(codeCancelled, start)
		return
	}
	code := g.exchange(ctx, w, r, rt, adm.Ticket, start)
	adm.Release()
	rt.Stats.DoneGRPC(code, start)
}

// exchange sends an admitted call within ctx (the call's, bounded by the
// target's timeout) and returns its grpc-status. ticket is the first
// attempt's breaker ticket; each attempt's ticket is done here.
//
// A failed attempt of which the client has seen nothing is retried as the
// target's retry policy and budget allow, if the call may be sent twice:
// every gRPC call is a POST, so only one carrying an idempotency-key (SPEC
// §4). Envoy's gRPC retries likewise follow only a Trailers-Only failure
// or a broken exchange; once an answer's headers are on their way to the
// client, its failure is the client's to see.
func (g *Grpc) exchange(ctx context.Context, w http.ResponseWriter, r *http.Request, rt *route, ticket breaker.Ticket, start time.Time) int {
	retryable := rt.Retry != nil && r.Header.Get("Idempotency-Key") != ""
	if rt.Retry != nil {
		rt.Retry.RecordExecution()
	}
	c := &call{r: r, rt: rt, start: start}
	c.deadline, _ = callDeadline(r.Header.Get("Grpc-Timeout"), start)
	if r.Body != nil && r.Body != http.NoBody {
		// A stream the upstream refused unprocessed is sent again by the
		// transport, and a retried call by warden; both need the body
		// from its start (replay.go).
		limit := replayMax
		if retryable {
			limit = retryMax
		}
		c.body, c.getBody = newReplayBody(r.Body, limit)
	}
	var next io.ReadCloser // not c.body itself, a nil *replayReader when there is none
	if c.body != nil {
		next = c.body
	}
	for attempt := 1; ; attempt++ {
		resp, err := rt.transport.RoundTrip(c.outbound(ctx, next))
		if retryable {
			if reason := c.failureBeforeAnswer(ctx, resp, err); reason != "" {
				ticket.Done(breaker.Failure)
				var again bool
				var refused control.Name
				ticket, next, again, refused = g.retry(ctx, c, attempt, reason, pushback(resp))
				if again {
					if err == nil {
						resp.Body.Close()
					}
					continue
				}
				// The failure goes to the client as it came; its outcome
				// was told to the breaker above.
				code, _ := g.relay(ctx, w, r, rt, resp, err, start, refused)
				return code
			}
		}
		code, outcome := g.relay(ctx, w, r, rt, resp, err, start, "")
		ticket.Done(outcome)
		return code
	}
}

// call is what the attempts of one call share.
type call struct {
	r        *http.Request
	rt       *route
	start    time.Time
	deadline time.Time // the caller's own, from its grpc-timeout; zero: none
	body     *replayReader
	getBody  func() (io.ReadCloser, error)
}

// outbound is the upstream's request for one attempt of the call, with
// body. A caller's grpc-timeout goes as what is left of it at the
// attempt, and no later than the target's timeout, as a gRPC client's own
// retries send it: the upstream then stops when nobody waits any more.
func (c *call) outbound(ctx context.Context, body io.ReadCloser) *http.Request {
	r, rt := c.r, c.rt
	host := rt.host
	if host == "" {
		host = r.Host
	}
	out := &http.Request{
		Method:        r.Method,
		URL:           &url.URL{Scheme: rt.scheme, Host: host, Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery},
		Proto:         "HTTP/2.0",
		ProtoMajor:    2,
		Header:        cleanHeader(r.Header.Clone()),
		Body:          r.Body,
		ContentLength: r.ContentLength,
		Host:          r.Host,
	}
	if rt.host != "" {
		out.Host = rt.host
	}
	if body != nil {
		out.Body, out.GetBody = body, c.getBody
	}
	if !c.deadline.IsZero() {
		dl := c.deadline
		if t, ok := ctx.Deadline(); ok && t.Before(dl) {
			dl = t
		}
		out.Header.Set("Grpc-Timeout", encodeTimeout(time.Until(dl)))
	}
	return out.WithContext(ctx)
}

// failureBeforeAnswer describes a failed attempt of which the client has
// seen nothing, for a retry and its non_retryable entries: an exchange
// that broke (not by the client, the call's deadline or the target's
// timeout, which are not retried), or an answer that is only a failing
// status (Trailers-Only; DEADLINE_EXCEEDED is a timeout), or an HTTP error
// without one. "" for anything else.
func (c *call) failureBeforeAnswer(ctx context.Context, resp *http.Response, err error) string {
	if err != nil {
		if ctx.Err() != nil || stalled(c.r) || (!c.deadline.IsZero() && !time.Now().Before(c.deadline)) {
			return ""
		}
		return err.Error()
	}
	if s := resp.Header.Get("Grpc-Status"); s != "" {
		code, err := strconv.Atoi(s)
		if err != nil || code == codeDeadlineExceeded || breaker.ClassifyGRPC(code) != breaker.Failure {
			return ""
		}
		return "grpc-status " + s + " " + codeName(code) + "\n" + decodeMessage(resp.Header.Get("Grpc-Message"))
	}
	if resp.StatusCode != http.StatusOK {
		return resp.Proto + " " + resp.Status
	}
	return ""
}

// pushback's answers other than a delay.
const (
	noPushback   = time.Duration(-1) // the upstream said nothing of when to retry
	stopPushback = time.Duration(-2) // it asked for no retry
)

// pushback reads the upstream's grpc-retry-pushback-ms (gRFC A6), which
// gRPC clients obey: a delay of that many milliseconds in place of the
// policy's, and for a negative or malformed value, no retry at all.
func pushback(resp *http.Response) time.Duration {
	if resp == nil {
		return noPushback
	}
	v, ok := resp.Header["Grpc-Retry-Pushback-Ms"]
	if !ok {
		return noPushback
	}
	ms, err := strconv.ParseInt(strings.TrimSpace(strings.Join(v, ",")), 10, 32)
	if err != nil || ms < 0 {
		return stopPushback
	}
	return time.Duration(ms) * time.Millisecond
}

// retry decides whether to retry after failed attempt number attempt
// (1-based), after the policy's delay or the upstream's pushback (when not
// noPushback), up to max_delay (admit.Retry), and returns the retry's
// ticket and body.
func (g *Grpc) retry(ctx context.Context, c *call, attempt int, reason string, push time.Duration) (ticket breaker.Ticket, next io.ReadCloser, again bool, refused control.Name) {
	rt := c.rt
	if push == stopPushback {
		return breaker.Ticket{}, nil, false, "" // the upstream asked not to
	}
	d := rt.Retry.Delay(attempt, nil)
	if push != noPushback {
		d = rt.Retry.Cap(push) // max_delay holds over the upstream's ask too
	}
	if !c.deadline.IsZero() && time.Until(c.deadline) <= d {
		return breaker.Ticket{}, nil, false, "" // it could not start within the caller's own deadline
	}
	if c.body != nil {
		// Taken before the budget is charged: once more than retryMax has
		// gone out, the call cannot be sent again.
		b, err := c.body.b.next()
		if err != nil {
			return breaker.Ticket{}, nil, false, ""
		}
		next = b
	}
	ticket, again, refused = admit.Retry(ctx, &rt.Target, g.opts.Clock, attempt, reason, d)
	if !again {
		return breaker.Ticket{}, nil, false, refused
	}
	return ticket, next, true, ""
}

// relay passes an attempt's answer (or its failure, err) on to the client
// and returns the call's grpc-status and the breaker outcome. mark names a
// control that ended the retries (retry_budget) for the client to see.
func (g *Grpc) relay(ctx context.Context, w http.ResponseWriter, r *http.Request, rt *route, resp *http.Response, err error, start time.Time, mark control.Name) (int, breaker.Outcome) {
	if err != nil {
		return g.failed(w, r, ctx, rt, err, false, start, mark)
	}
	defer resp.Body.Close()
	h := w.Header()
	for k, vv := range cleanHeader(resp.Header) {
		h[k] = vv
	}
	if mark != "" {
		// Only a failure before any answer is marked: a Trailers-Only
		// response, whose headers are its trailers.
		h.Set(control.Header, string(mark))
		rt.Stats.Reject(mark, rt.Name)
	}
	w.WriteHeader(resp.StatusCode)
	if err := copyFlushing(w, resp.Body); err != nil {
		return g.failed(w, r, ctx, rt, err, true, start, "")
	}
	for k, vv := range resp.Trailer {
		h[http.TrailerPrefix+k] = vv
	}
	status := resp.Trailer.Get("Grpc-Status")
	if status == "" {
		status = resp.Header.Get("Grpc-Status") // Trailers-Only
	}
	code, err := strconv.Atoi(status)
	if err != nil {
		// No status at all: not a gRPC answer. A non-200 HTTP status is
		// the upstream (or a proxy before it) failing.
		if resp.StatusCode != http.StatusOK {
			return codeUnavailable, breaker.Failure
		}
		return codeInternal, breaker.Failure
	}
	return code, breaker.ClassifyGRPC(code)
}

// failed ends a call whose exchange broke: before the response started, as
// a Trailers-Only response; after, with trailers. A call the client
// cancelled is neutral for the breaker.
// A control in mark (retry_budget) is named in place of upstream.
func (g *Grpc) failed(w http.ResponseWriter, r *http.Request, ctx context.Context, rt *route, err error, started bool, start time.Time, mark control.Name) (int, breaker.Outcome) {
	if r.Context().Err() != nil {
		return codeCancelled, breaker.Neutral
	}
	if stalled(r) {
		// The client stopped sending (egress.timeouts.body_idle): its
		// doing, not the upstream's.
		endCall(w, started, codeDeadlineExceeded, "request stream stalled: nothing arrived for egress.timeouts.body_idle", "")
		return codeDeadlineExceeded, breaker.Neutral
	}
	if deadlinePassed(r.Header.Get("Grpc-Timeout"), start, time.Now()) {
		// The call's own deadline passed: the upstream, told it, may
		// reset the stream (CANCEL) before the client's cancel reaches
		// warden. The call ended as its client asked, which says nothing
		// of the upstream: neutral, and no refusal.
		endCall(w, started, codeDeadlineExceeded, "the call's deadline (grpc-timeout "+r.Header.Get("Grpc-Timeout")+") passed", "")
		return codeDeadlineExceeded, breaker.Neutral
	}
	code, ctl := codeUnavailable, control.Upstream
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		code, ctl = codeDeadlineExceeded, control.Timeout
	}
	if mark != "" {
		ctl = mark
	}
	rt.Stats.Reject(ctl, rt.Name)
	endCall(w, started, code, "upstream "+rt.Name+": "+err.Error(), ctl)
	return code, breaker.Failure
}

// endCall gives a call its status: as a Trailers-Only response when
// nothing was sent yet, else in the trailers.
func endCall(w http.ResponseWriter, started bool, code int, msg string, ctl control.Name) {
	if !started {
		trailersOnly(w, code, msg, ctl)
		return
	}
	h := w.Header()
	h.Set(http.TrailerPrefix+"Grpc-Status", strconv.Itoa(code))
	h.Set(http.TrailerPrefix+"Grpc-Message", encodeMessage(msg))
	if ctl != "" {
		h.Set(http.TrailerPrefix+control.Header, string(ctl))
	}
}

// trailersOnly answers a call without contacting the upstream: one HEADERS
// frame ending the stream, carrying the status (gRPC's Trailers-Only).
func trailersOnly(w http.ResponseWriter, code int, msg string, ctl control.Name) {
	h := w.Header()
	h.Set("Content-Type", "application/grpc")
	h.Set("Grpc-Status", strconv.Itoa(code))
	h.Set("Grpc-Message", encodeMessage(msg))
	if ctl != "" {
		h.Set(control.Header, string(ctl))
	}
	w.WriteHeader(http.StatusOK)
}

// cleanHeader removes connection-specific headers, keeping TE: trailers.
func cleanHeader(h http.Header) http.Header {
	for _, c := range h.Values("Connection") {
		for _, tok := range strings.Split(c, ",") {
			h.Del(strings.TrimSpace(tok))
		}
	}
	for _, k := range hopByHop {
		h.Del(k)
	}
	if te := h.Get("Te"); te != "" {
		if strings.Contains(strings.ToLower(te), "trailers") {
			h.Set("Te", "trailers")
		} else {
			h.Del("Te")
		}
	}
	return h
}

var copyBufs = sync.Pool{New: func() any { return new([32 << 10]byte) }}

// copyFlushing copies a response body message by message: each read is
// flushed at once, so server-streaming calls are not held back.
func copyFlushing(w http.ResponseWriter, body io.Reader) error {
	buf := copyBufs.Get().(*[32 << 10]byte)
	defer copyBufs.Put(buf)
	rc := http.NewResponseController(w)
	for {
		n, err := body.Read(buf[:])
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return werr
			}
			if ferr := rc.Flush(); ferr != nil {
				return ferr
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// codeNames are the gRPC status codes' names, for a failure's reason.
var codeNames = [...]string{"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
	"ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
	"UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"}

func codeName(code int) string {
	if code >= 0 && code < len(codeNames) {
		return codeNames[code]
	}
	return "CODE_" + strconv.Itoa(code)
}

// decodeMessage undoes a grpc-message's percent-encoding; a value that is
// not validly encoded is kept as it came.
func decodeMessage(msg string) string {
	if !strings.Contains(msg, "%") {
		return msg
	}
	if d, err := url.PathUnescape(msg); err == nil {
		return d
	}
	return msg
}

// encodeMessage percent-encodes a grpc-message value as the gRPC spec asks
// (bytes outside printable ASCII, and '%').
func encodeMessage(msg string) string {
	var b strings.Builder
	for i := 0; i < len(msg); i++ {
		c := msg[i]
		if c >= ' ' && c <= '~' && c != '%' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte("0123456789ABCDEF"[c>>4])
		b.WriteByte("0123456789ABCDEF"[c&15])
	}
	return b.String()
}

// timeoutUnits are the units of a grpc-timeout header, finest first.
var timeoutUnits = []struct {
	unit byte
	d    time.Duration
}{{'n', time.Nanosecond}, {'u', time.Microsecond}, {'m', time.Millisecond}, {'S', time.Second}, {'M', time.Minute}, {'H', time.Hour}}

// callDeadline is when a call's own deadline passes: its grpc-timeout
// header (1-8 digits and a unit, H M S m u n) counted from start. A
// missing or malformed header is no deadline (ok false).
func callDeadline(timeout string, start time.Time) (deadline time.Time, ok bool) {
	if len(timeout) < 2 || len(timeout) > 9 {
		return time.Time{}, false
	}
	n, err := strconv.ParseInt(timeout[:len(timeout)-1], 10, 64)
	if err != nil || n < 0 {
		return time.Time{}, false
	}
	for _, u := range timeoutUnits {
		if u.unit == timeout[len(timeout)-1] {
			if n > int64(math.MaxInt64/u.d) {
				return time.Time{}, false
			}
			return start.Add(time.Duration(n) * u.d), true
		}
	}
	return time.Time{}, false
}

// deadlinePassed reports whether the deadline of a call whose grpc-timeout
// is timeout, counted from start, has passed at now.
func deadlinePassed(timeout string, start, now time.Time) bool {
	dl, ok := callDeadline(timeout, start)
	return ok && !now.Before(dl)
}

// encodeTimeout writes d as a grpc-timeout value: at most 8 digits, in the
// finest unit that holds it, rounded up so that a deadline is never
// shortened to nothing (a passed one is 1n); only within an hour of the
// longest Duration, where rounding up would not read back, is it rounded
// down.
func encodeTimeout(d time.Duration) string {
	if d < time.Nanosecond {
		d = time.Nanosecond
	}
	for _, u := range timeoutUnits {
		n := d / u.d
		if d%u.d != 0 && n < math.MaxInt64/u.d {
			n++
		}
		if n <= 99999999 {
			return strconv.FormatInt(int64(n), 10) + string(u.unit)
		}
	}
	return "99999999H" // not reached: the longest Duration is 2562047 hours
}
