package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"
)

const breakerPolicy = `egress:
  http_listen: %s
  allow_unlisted: false
targets:
  - name: flaky
    hosts: [flaky.chaos]
    upstream: "http://%s"
    timeout: 3s
    retry: { count: 0 }
    circuit_breaker: { enabled: true, failure_ratio: 0.5, minimum_requests: 5, window: 10s, open: 1s, max_open: 4s }
`

// sickHold is how long the failing upstream holds each request before its
// 500: long enough that a second probe let through would overlap the first.
const sickHold = 300 * time.Millisecond

// flaky is an upstream on a fixed address that can be up (200), sick
// (500 after sickHold) or down (nothing listening). It counts the requests
// it holds at once while sick.
type flaky struct {
	addr string

	mu          sync.Mutex
	srv         *http.Server
	sick        bool
	inflight    int
	maxInflight int // while sick
	sickSeen    int // requests that reached it while sick
}

func (f *flaky) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	sick := f.sick
	if sick {
		f.inflight++
		f.sickSeen++
		f.maxInflight = max(f.maxInflight, f.inflight)
	}
	f.mu.Unlock()
	if !sick {
		_, _ = w.Write([]byte("ok"))
		return
	}
	time.Sleep(sickHold)
	f.mu.Lock()
	f.inflight--
	f.mu.Unlock()
	http.Error(w, "sick", http.StatusInternalServerError)
}

// up starts serving on the fixed address, sick or not.
func (f *flaky) up(sick bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sick = sick
	if f.srv != nil {
		return nil
	}
	var ln net.Listener
	var err error
	for range 50 { // the port was just closed; a retry covers a racing bind
		if ln, err = net.Listen("tcp", f.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return err
	}
	f.srv = &http.Server{Handler: http.HandlerFunc(f.serve)}
	go func() { _ = f.srv.Serve(ln) }()
	return nil
}

// down closes the listener and every connection: connection refused.
func (f *flaky) down() {
	f.mu.Lock()
	srv := f.srv
	f.srv = nil
	f.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
}

// breakerUpstream: traffic through the egress to a target with a breaker
// (minimum 5 requests, open 1 s, max_open 4 s) whose upstream dies, comes
// back failing slowly, then recovers. The breaker opens, each half-open
// period lets exactly one probe through (the failing upstream never holds
// two requests at once while the breaker is open), and it closes once the
// upstream is healthy; clients see only 200, 502/500 from the upstream and
// 503 circuit_breaker.
func breakerUpstream(ctx context.Context, s *scenario) error {
	a, err := freeAddrs()
	if err != nil {
		return err
	}
	up := &flaky{addr: a.other}
	if err := up.up(false); err != nil {
		return err
	}
	s.later(up.down)
	w, err := s.launch(ctx, policyFor(a.admin, fmt.Sprintf(breakerPolicy, a.egress, up.addr)), a.admin, 0)
	if err != nil {
		return err
	}
	dead, sick := 3*time.Second, 5*time.Second
	s.row.load = "300 req/s via egress on 8 connections"
	s.row.fault = fmt.Sprintf("upstream down %v, back failing (500 after %v) %v, then healthy", dead, sickHold, sick)

	states := pollBreakers(ctx, w)
	defer states.stop()
	tr := startTraffic(ctx, trafficConfig{addr: a.egress, host: "flaky.chaos", path: "/x", conns: 8, rate: 300, keep: true})
	defer tr.stop()
	if !sleep(ctx, time.Second) {
		return ctx.Err()
	}
	died := time.Now()
	up.down()
	if !sleep(ctx, dead) {
		return ctx.Err()
	}
	sickFrom := time.Now()
	if err := up.up(true); err != nil {
		return err
	}
	if !sleep(ctx, sick) {
		return ctx.Err()
	}
	healed := time.Now()
	if err := up.up(false); err != nil {
		return err
	}
	waitFor(ctx, 15*time.Second, func() bool { return !tr.firstOK(healed).IsZero() })
	first := tr.firstOK(healed)
	sleep(ctx, 2*time.Second)
	end := time.Now()
	tr.stop()
	states.stop()

	if !first.IsZero() {
		s.row.recovery = first.Sub(healed)
	}
	up.mu.Lock()
	maxSick, probes := up.maxInflight, up.sickSeen
	up.mu.Unlock()
	opened := classesOf(tr.between(died, sickFrom))["503 circuit_breaker"]
	unexpected := 0
	for c, n := range tr.classes() {
		switch c {
		case "200", "502 upstream", "503 circuit_breaker", "500":
		default:
			unexpected += n
		}
	}
	last := tr.between(end.Add(-time.Second), end)
	s.row.clientErrors = tr.errors()
	s.row.lostRequests = tr.lost()
	s.row.errorsNote = "502/500/503 while the upstream was down or failing"
	s.row.maxConc, s.row.capConc = maxSick, 1
	s.row.check("opens", opened > 0 && states.seen["open"] > 0,
		"while the upstream was down clients got %s; /v1/breakers states seen %v", summarize(classesOf(tr.between(died, sickFrom)), ""), states.seen)
	s.row.check("one-probe-per-half-open", probes >= 1 && maxSick <= 1,
		"%d probes reached the failing upstream in %v, at most %d at once (each held %v)", probes, sick, maxSick, sickHold)
	s.row.check("closes-when-back", !first.IsZero() && states.last == "closed" && len(last) > 0 && classesOf(last)["200"] == len(last),
		"first 200 %s after the upstream healed; final state %q; last second: %s", s.row.recoveryCell(), states.last, summarize(classesOf(last), ""))
	s.row.check("clients-saw-only-expected", unexpected == 0, "all answers: %s", tr.summary())
	s.settle()
	return nil
}

// breakerPoller reads /v1/breakers every 100 ms: which states it saw, and
// the last one.
type breakerPoller struct {
	*repeater
	seen map[string]int
	last string
}

func pollBreakers(ctx context.Context, w *warden) *breakerPoller {
	p := &breakerPoller{seen: map[string]int{}}
	p.repeater = repeat(ctx, 100*time.Millisecond, func(ctx context.Context) {
		code, body, err := w.get(ctx, "/v1/breakers")
		var rows []struct{ State string }
		if err == nil && code == 200 && json.Unmarshal(body, &rows) == nil && len(rows) > 0 {
			p.seen[rows[0].State]++
			p.last = rows[0].State
		}
	})
	return p
}
