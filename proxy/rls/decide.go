package rls

import (
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/warden-dev/warden/governor/control"
	"github.com/warden-dev/warden/governor/window"
)

// call is the scratch of one ShouldRateLimit, pooled.
type call struct {
	wants []window.Want
	dec   []window.Decision
	lims  []*limit
	refs  []ref // which windows each descriptor matched
	// The windows of the previous try, while redirect rebuilds them.
	prevWants []window.Want
	prevLims  []*limit
	prevRefs  []ref
}

type ref struct{ desc, want int }

var calls = sync.Pool{New: func() any { return new(call) }}

func (c *call) reset() {
	clear(c.wants)
	clear(c.lims)
	clear(c.prevWants)
	clear(c.prevLims)
	c.wants, c.dec, c.lims, c.refs = c.wants[:0], c.dec[:0], c.lims[:0], c.refs[:0]
	c.prevWants, c.prevLims, c.prevRefs = c.prevWants[:0], c.prevLims[:0], c.prevRefs[:0]
}

// window returns the index of l's window for value, adding it with n hits;
// a window matched twice in one request is counted once, with the larger n.
func (c *call) window(l *limit, value []byte, n int64) int {
	for j, w := range c.wants {
		if w.Scope == l.scope && string(w.Key) == string(value) {
			c.wants[j].N = max(w.N, n)
			return j
		}
	}
	c.wants = append(c.wants, window.Want{Scope: l.scope, Key: value, Limit: l.rate, N: n})
	c.lims = append(c.lims, l)
	return len(c.wants) - 1
}

// overflowed reports whether a window of the last try was refused because
// its key-only entry's window already holds MaxKeys values.
func (c *call) overflowed() bool {
	for j := range c.wants {
		if c.dec[j].Overflow && c.lims[j].overflow != nil {
			return true
		}
	}
	return false
}

// redirect rebuilds the request's windows with each value its entry's cap
// refused counted in the entry's overflow window instead (values that
// overflow together share it, with the larger n).
func (c *call) redirect() {
	c.prevWants, c.wants = c.wants, c.prevWants[:0]
	c.prevLims, c.lims = c.lims, c.prevLims[:0]
	c.prevRefs, c.refs = c.refs, c.prevRefs[:0]
	for _, r := range c.prevRefs {
		w, l := c.prevWants[r.want], c.prevLims[r.want]
		if c.dec[r.want].Overflow && l.overflow != nil {
			l, w.Key = l.overflow, nil
		}
		c.refs = append(c.refs, ref{desc: r.desc, want: c.window(l, w.Key, w.N)})
	}
}

// maxRedirects bounds the tries of one request: a value that had room when
// checked may find the window full on the next try (another request took
// the last place), and is redirected then.
const maxRedirects = 2

// decide answers one request at now against cfg's domains and counter.
//
// Matching: each entry of a descriptor whose key the domain limits selects
// a window — the value's own entry if the domain has one, else the key's —
// keyed by the entry's value. A descriptor is OVER_LIMIT when any of its
// windows is; its status reports its most restrictive window. A descriptor
// that matches nothing, and every descriptor of an unknown domain, is OK
// with no limit (as envoyproxy/ratelimit answers).
//
// Counting is all or nothing across the whole request: the windows are
// taken together (Counter.TakeAll), so when any descriptor is over its
// limit no window is counted — the request is refused, and a refused
// request consumes no one's quota (envoyproxy/ratelimit counts each
// descriptor independently, and counts refused hits too).
// A value its key-only entry's window has no room for (MaxKeys values
// already; window.Decision.Overflow) is counted in the entry's overflow
// window instead: the request is taken again with it redirected there.
// The outcome names the control that refused ("" when OK) and the metrics
// of the domain (of unknown domains for one that is not configured).
func decide(cfg *config, counter window.Counter, req *rlspb.RateLimitRequest, now time.Time) (outcome, error) {
	if req.GetDomain() == "" {
		return outcome{}, status.Error(codes.InvalidArgument, "rate limit domain must not be empty")
	}
	descs := req.GetDescriptors()
	if len(descs) == 0 {
		return outcome{}, status.Error(codes.InvalidArgument, "rate limit descriptor list must not be empty")
	}
	resp := &rlspb.RateLimitResponse{
		OverallCode: rlspb.RateLimitResponse_OK,
		Statuses:    make([]*rlspb.RateLimitResponse_DescriptorStatus, len(descs)),
	}
	dom := cfg.domains[req.GetDomain()]
	if dom == nil {
		for i := range resp.Statuses {
			resp.Statuses[i] = &rlspb.RateLimitResponse_DescriptorStatus{Code: rlspb.RateLimitResponse_OK}
		}
		return outcome{resp: resp, m: cfg.unknown}, nil
	}
	c := calls.Get().(*call)
	defer func() { c.reset(); calls.Put(c) }()
	hits := int64(max(req.GetHitsAddend(), 1))
	for i, d := range descs {
		n := hits
		if h := d.GetHitsAddend(); h != nil {
			// Set, it overrides the request's, and 0 asks without
			// counting (Envoy's "check only").
			n = int64(min(h.GetValue(), math.MaxInt32))
		}
		for _, e := range d.GetEntries() {
			l := dom.match(e.GetKey(), e.GetValue())
			if l == nil {
				continue
			}
			if d.GetIsNegativeHits() {
				// Envoy returning budget: credit the window, count nothing.
				counter.Refund(l.scope, []byte(e.GetValue()), now, n)
				continue
			}
			c.refs = append(c.refs, ref{desc: i, want: c.window(l, []byte(e.GetValue()), n)})
		}
	}
	all, redirected := true, false
	for try := 0; len(c.wants) > 0; try++ {
		c.dec = slices.Grow(c.dec[:0], len(c.wants))[:len(c.wants)]
		all = counter.TakeAll(c.wants, now, c.dec)
		if all || try == maxRedirects || !c.overflowed() {
			break
		}
		c.redirect()
		redirected = true
	}
	for i := range resp.Statuses {
		resp.Statuses[i] = c.status(i, now)
	}
	if all {
		if j := c.headline(); j >= 0 {
			resp.ResponseHeadersToAdd = c.headers(j, now, false)
		}
		return outcome{resp: resp, m: dom.m, overflowed: redirected}, nil
	}
	resp.OverallCode = rlspb.RateLimitResponse_OVER_LIMIT
	j := c.headline()
	resp.ResponseHeadersToAdd = c.headers(j, now, true)
	ref := c.refusal(j, now)
	resp.RawBody = ref.AppendBody(make([]byte, 0, 128))
	return outcome{resp: resp, m: dom.m, control: c.control(j), overflowed: redirected}, nil
}

type outcome struct {
	resp       *rlspb.RateLimitResponse
	m          *domainMetrics
	control    control.Name // what refused; "" when OK
	overflowed bool         // a value was counted in its entry's overflow window
}

// refused reports whether window j refused (over its limit, or unavailable).
func (c *call) refused(j int) bool { return !c.dec[j].Allowed }

// tighter reports whether window a is more restrictive than b: refused
// first, then less remaining, then the later reset.
func (c *call) tighter(a, b int) bool {
	if ra, rb := c.refused(a), c.refused(b); ra != rb {
		return ra
	}
	if x, y := c.remaining(a), c.remaining(b); x != y {
		return x < y
	}
	return c.dec[a].End().After(c.dec[b].End())
}

func (c *call) remaining(j int) int64 {
	if c.refused(j) {
		return 0
	}
	return c.dec[j].Remaining()
}

func (c *call) status(desc int, now time.Time) *rlspb.RateLimitResponse_DescriptorStatus {
	best := -1
	for _, r := range c.refs {
		if r.desc == desc && (best < 0 || c.tighter(r.want, best)) {
			best = r.want
		}
	}
	st := &rlspb.RateLimitResponse_DescriptorStatus{Code: rlspb.RateLimitResponse_OK}
	if best < 0 {
		return st
	}
	l, d := c.lims[best], c.dec[best]
	if c.refused(best) {
		st.Code = rlspb.RateLimitResponse_OVER_LIMIT
	}
	st.CurrentLimit = l.current
	st.LimitRemaining = uint32(min(c.remaining(best), math.MaxUint32))
	st.DurationUntilReset = durationpb.New(max(d.ResetIn(now), 0))
	return st
}

// headline is the window the response headers describe: the most
// restrictive of the request (-1 when nothing matched).
func (c *call) headline() int {
	best := -1
	for j := range c.wants {
		if best < 0 || c.tighter(j, best) {
			best = j
		}
	}
	return best
}

// resetSeconds is the whole seconds, at least 1, until window j resets; 1
// while the backend is unavailable.
func (c *call) resetSeconds(j int, now time.Time) int64 {
	if c.dec[j].Unavailable {
		return 1
	}
	return control.RetryAfterSeconds(c.dec[j].ResetIn(now))
}

// control names what refused window j. A domain's windows are
// fixed-window caps per descriptor value — per caller, like tenant caps —
// so their refusals are tenant_rate; a fail_closed backend outage is
// upstream.
func (c *call) control(j int) control.Name {
	if c.dec[j].Unavailable {
		return control.Upstream
	}
	return control.TenantRate
}

// refusal is what the RLS says when window j refused. Its body is the
// local reply Envoy sends with the 429, in the shape of warden's own 429s
// but without current:
// {"control":"tenant_rate","quota":"rls:edge:tenant=acme","limit":5000,"retryAfterSeconds":12}.
func (c *call) refusal(j int, now time.Time) control.Refusal {
	return control.Refusal{Control: c.control(j), Quota: c.lims[j].quota + string(c.wants[j].Key),
		Limit: c.lims[j].rate, RetryAfter: c.resetSeconds(j, now)}
}

func (c *call) headers(j int, now time.Time, refused bool) []*corev3.HeaderValue {
	if j < 0 {
		return nil
	}
	reset := strconv.FormatInt(c.resetSeconds(j, now), 10)
	var h []*corev3.HeaderValue
	if !c.dec[j].Unavailable {
		// A fail_closed outage counted nothing: no quota to report.
		h = []*corev3.HeaderValue{
			c.lims[j].limitHeader,
			{Key: control.HeaderRemaining, Value: strconv.FormatInt(c.remaining(j), 10)},
			{Key: control.HeaderReset, Value: reset},
		}
	}
	if refused {
		h = append(h, &corev3.HeaderValue{Key: control.HeaderRetryAfter, Value: reset},
			&corev3.HeaderValue{Key: control.Header, Value: string(c.control(j))})
	}
	return h
}
