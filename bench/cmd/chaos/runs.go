package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// submitter offers runs to the runs API at a fixed rate from a few
// connections (open loop: a submit that hangs does not slow the offer
// below what the connections can carry) and records which were accepted.
type submitter struct {
	mu       sync.Mutex
	accepted []string    // ids answered 202, in order
	okAt     []time.Time // when each 202 came
	offered  int
	refused  map[int]int // status → count, for answers other than 202
	lost     int         // no answer at all (connection refused, reset, timeout)
	firstErr string
	done     chan struct{}
}

// startRuns submits runs of definition def to ingress at rate per second
// until ctx ends; wait returns once every submit in flight has ended.
func startRuns(ctx context.Context, ingress, def string, rate float64, conns int) *submitter {
	s := &submitter{refused: map[int]int{}, done: make(chan struct{})}
	hc := &fasthttp.HostClient{Addr: ingress, MaxConns: conns, MaxIdemponentCallAttempts: 1,
		ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second, NoDefaultUserAgentHeader: true, MaxIdleConnDuration: time.Hour}
	go func() {
		defer close(s.done)
		defer hc.CloseIdleConnections()
		offer(ctx, rate, conns, func(n int) { s.submit(hc, ingress, def, n) })
	}()
	return s
}

func (s *submitter) wait() { <-s.done }

// acceptedFrom is the ids accepted after the first i.
func (s *submitter) acceptedFrom(i int) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.accepted[i:]...)
}

func (s *submitter) submit(hc *fasthttp.HostClient, ingress, def string, n int) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("/v1/runs")
	req.Header.SetHost(ingress)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	req.Header.Set("x-tenant-id", "chaos")
	req.SetBodyString(fmt.Sprintf(`{"name":%q,"input":{"n":%d}}`, def, n))
	err := hc.DoTimeout(req, resp, 10*time.Second)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.offered++
	switch {
	case err != nil:
		s.lost++
		if s.firstErr == "" {
			s.firstErr = err.Error()
		}
	case resp.StatusCode() == fasthttp.StatusAccepted:
		var receipt struct{ ID string }
		if json.Unmarshal(resp.Body(), &receipt) == nil && receipt.ID != "" {
			s.accepted = append(s.accepted, receipt.ID)
			s.okAt = append(s.okAt, time.Now())
		} else {
			s.refused[202]++
		}
	default:
		s.refused[resp.StatusCode()]++
		if s.firstErr == "" {
			s.firstErr = fmt.Sprintf("%d %.200s", resp.StatusCode(), resp.Body())
		}
	}
}

// failures is every submit that was not accepted.
func (s *submitter) failures() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.lost
	for _, c := range s.refused {
		n += c
	}
	return n
}

// firstOKAfter is the time of the first 202 after t (zero if none).
func (s *submitter) firstOKAfter(t time.Time) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return firstAfter(s.okAt, t)
}

// checkRuns records what became of the runs offered (the row's counts)
// and the invariants every run scenario shares: no accepted run is lost,
// and the worker never sees more than lanes deliveries at once. why says
// what the refused submits met.
func (r *row) checkRuns(sub *submitter, out runOutcome, st runStats, lanes int, why string) {
	r.lostRuns = len(out.lost)
	r.duplicates = len(st.duplicated)
	r.maxConc, r.capConc = st.maxInflight, lanes
	r.lostRequests = sub.lost
	r.clientErrors = sub.failures()
	r.errorsNote = why
	r.check("no-accepted-run-lost", len(sub.accepted) > 0 && len(out.lost) == 0,
		"%d offered, %d accepted (202), final states %v, not final %s; not accepted: %d unanswered, %v %s",
		sub.offered, len(sub.accepted), out.status, short(out.lost), sub.lost, sub.refused, firstOf(sub.firstErr))
	r.check("concurrency<=lanes", st.maxInflight <= lanes, "worker saw at most %d deliveries at once, lanes %d", st.maxInflight, lanes)
}

var terminal = map[string]bool{"COMPLETED": true, "FAILED": true, "FAILED_WITH_TERMINAL_ERROR": true, "TIMED_OUT": true, "CANCELLED": true}

// runOutcome is where the accepted runs ended up.
type runOutcome struct {
	status map[string]int // final status (or last seen) → runs
	lost   []string       // not final by the deadline, or unknown to warden
}

// runTracker follows every run a submitter had accepted until it is in a
// final state. Rounds during the load see each run end before a short
// retention could purge it (a purged run answers 404, like a lost one).
type runTracker struct {
	ingress string
	sub     *submitter
	hc      *fasthttp.HostClient
	taken   int      // how many of sub's accepted runs are tracked
	pending []string // not final yet
	final   map[string]int
	last    map[string]string // the last status seen of each pending run
}

func trackRuns(ingress string, sub *submitter) *runTracker {
	return &runTracker{ingress: ingress, sub: sub, final: map[string]int{}, last: map[string]string{},
		hc: &fasthttp.HostClient{Addr: ingress, MaxConns: 1, ReadTimeout: 5 * time.Second, NoDefaultUserAgentHeader: true, MaxIdleConnDuration: time.Hour}}
}

// round reads every pending run once, the newly accepted ones included.
// A round, once begun, is finished: each read has its own timeout.
func (t *runTracker) round(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	fresh := t.sub.acceptedFrom(t.taken)
	t.taken += len(fresh)
	t.pending = append(t.pending, fresh...)
	// One connection, read in turn: a tracker that opened more when a
	// round found more runs would add descriptors to warden mid-soak.
	var still []string
	for _, id := range t.pending {
		st := runStatus(t.hc, t.ingress, id)
		if terminal[st] {
			t.final[st]++
			delete(t.last, id)
		} else {
			t.last[id] = st
			still = append(still, id)
		}
	}
	t.pending = still
}

// finish reads the pending runs until every one is final or limit passes,
// and says where they all ended.
func (t *runTracker) finish(ctx context.Context, limit time.Duration) runOutcome {
	waitFor(ctx, limit, func() bool {
		t.round(ctx)
		return len(t.pending) == 0
	})
	t.hc.CloseIdleConnections()
	out := runOutcome{status: map[string]int{}, lost: t.pending}
	for st, n := range t.final {
		out.status[st] = n
	}
	for _, id := range t.pending {
		out.status[t.last[id]]++
	}
	return out
}

// runStatus is a run's status, or why it could not be read.
func runStatus(hc *fasthttp.HostClient, ingress, id string) string {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("/v1/runs/" + id)
	req.Header.SetHost(ingress)
	if err := hc.DoTimeout(req, resp, 5*time.Second); err != nil {
		return "unreachable"
	}
	if resp.StatusCode() != 200 {
		return fmt.Sprintf("HTTP %d", resp.StatusCode())
	}
	var v struct{ Status string }
	if json.Unmarshal(resp.Body(), &v) != nil {
		return "unparsable"
	}
	return v.Status
}
