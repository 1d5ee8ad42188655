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
}

// submitRuns submits runs of definition def to ingress at rate per second
// until ctx ends, and returns once every submit in flight has ended.
func submitRuns(ctx context.Context, ingress, def string, rate float64, conns int) *submitter {
	s := &submitter{refused: map[int]int{}}
	hc := &fasthttp.HostClient{Addr: ingress, MaxConns: conns, MaxIdemponentCallAttempts: 1,
		ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second, NoDefaultUserAgentHeader: true, MaxIdleConnDuration: time.Hour}
	defer hc.CloseIdleConnections()
	offer(ctx, rate, conns, func(n int) { s.submit(hc, ingress, def, n) })
	return s
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
	status   map[string]int // final status (or last seen) → runs
	lost     []string       // not terminal by the deadline, or unknown to warden
	lastSeen map[string]string
}

// awaitTerminal polls every run until it is in a final state or limit
// passes, and says which ones never got there.
func awaitTerminal(ctx context.Context, ingress string, ids []string, limit time.Duration) runOutcome {
	out := runOutcome{status: map[string]int{}, lastSeen: map[string]string{}}
	hc := &fasthttp.HostClient{Addr: ingress, MaxConns: 8, ReadTimeout: 5 * time.Second, NoDefaultUserAgentHeader: true}
	defer hc.CloseIdleConnections()
	pending := append([]string(nil), ids...)
	deadline := time.Now().Add(limit)
	for len(pending) > 0 && time.Now().Before(deadline) && ctx.Err() == nil {
		var mu sync.Mutex
		var still []string
		work := make(chan string)
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for id := range work {
					st := runStatus(hc, ingress, id)
					mu.Lock()
					out.lastSeen[id] = st
					if terminal[st] {
						out.status[st]++
					} else {
						still = append(still, id)
					}
					mu.Unlock()
				}
			}()
		}
		for _, id := range pending {
			work <- id
		}
		close(work)
		wg.Wait()
		pending = still
		if len(pending) > 0 {
			sleep(ctx, 250*time.Millisecond)
		}
	}
	for _, id := range pending {
		out.status[out.lastSeen[id]]++
	}
	out.lost = pending
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
