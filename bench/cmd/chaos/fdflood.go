package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

const floodPolicy = `ingress: { listen: %s, worker: "http://%s"%s }
egress: { http_listen: %s%s }
targets:
  - name: up
    hosts: [up.chaos]
    upstream: "http://%s"
`

// listenerProbe is one request on a new connection to a data-plane
// listener: served (any HTTP answer), refused (the connection was refused,
// reset or closed without an answer, as a listener at max_connections
// does) or stalled (no answer within the probe's timeout: nobody accepts).
type listenerProbe struct {
	listener   string
	sent, done time.Time
	result     string // "served", "refused", "stalled"
	status     int
}

const probeTimeout = 2 * time.Second

func probeListener(ctx context.Context, c *http.Client, listener, addr, host string) listenerProbe {
	p := listenerProbe{listener: listener, sent: time.Now()}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/probe", nil)
	req.Host = host
	resp, err := c.Do(req)
	p.done = time.Now()
	switch {
	case err == nil:
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		p.result, p.status = "served", resp.StatusCode
	case isTimeoutErr(err):
		p.result = "stalled"
	default:
		p.result = "refused"
	}
	return p
}

func isTimeoutErr(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// fdFlood: warden with a lowered file limit, and more idle connections to
// its ingress and egress than that limit allows, held for a while, then
// released. Afterwards both listeners serve again without a restart, and
// meanwhile /readyz told the truth: a probe that found a listener not
// accepting (stalled) never coincides with /readyz answering 200 only.
// A listener that refuses the flood at max_connections always accepts,
// so its probes are refused, never stalled.
//
// capped says whether the listeners keep their default max_connections
// (derived from the file limit, so the flood is refused at the cap) or
// get one far above the file limit, so that the flood exhausts warden's
// descriptors and the listeners must ride out failing accepts.
func fdFlood(capped bool) func(ctx context.Context, s *scenario) error {
	return func(ctx context.Context, s *scenario) error { return flood(ctx, s, capped) }
}

func flood(ctx context.Context, s *scenario, capped bool) error {
	nofile := s.pick(1024, 2048)
	per := s.pick(3000, 12000)
	hold := s.pickDur(5*time.Second, 10*time.Second)
	wk, a, err := s.prepare(0)
	if err != nil {
		return err
	}
	admin, ingress, egress := a.admin, a.ingress, a.egress
	limit, capNote := "", "default max_connections"
	if !capped {
		limit, capNote = ", max_connections: 65536", "max_connections 65536"
	}
	w, err := s.launch(ctx, policyFor(admin, fmt.Sprintf(floodPolicy, ingress, wk.addr, limit, egress, limit, wk.addr)), admin, nofile)
	if err != nil {
		return err
	}
	pid := w.pid()
	s.row.load = fmt.Sprintf("%d idle connects each to ingress and egress (%d in all), probes every 250 ms", per, 2*per)
	s.row.fault = fmt.Sprintf("warden's RLIMIT_NOFILE %d, %s, flood held %v", nofile, capNote, hold)

	ready := pollReadyz(ctx, w)
	defer ready.stop()
	pr := probeListeners(ctx, []endpoint{{"ingress", ingress, ingress}, {"egress", egress, "up.chaos"}})
	defer pr.stop()
	if !sleep(ctx, time.Second) {
		return ctx.Err()
	}
	floods, err := s.startFloods([]string{ingress, egress}, per)
	if err != nil {
		return err
	}
	sleep(ctx, hold)
	closedByWarden := floods[0].release() + floods[1].release()
	released := time.Now()
	// Both listeners must serve again; wait for it (bounded), then a little
	// more to see that they stay serving.
	var servedAgain map[string]time.Time
	waitFor(ctx, 20*time.Second, func() bool {
		servedAgain = pr.servedAfter(released)
		return len(servedAgain) == 2
	})
	sleep(ctx, 2*time.Second)
	pr.stop()
	ready.stop()

	t := tallyProbes(pr.all(), ready, released)
	var recovery time.Duration
	for _, when := range servedAgain {
		recovery = max(recovery, when.Sub(released))
	}
	if len(servedAgain) == 2 {
		s.row.recovery = recovery
	}
	refused, _ := w.metric(ctx, "warden_listener_refused_total")
	acceptErrs, _ := w.metric(ctx, "warden_listener_accept_errors_total")
	s.row.lostRequests = t.counts["ingress stalled"] + t.counts["egress stalled"]
	s.row.clientErrors = 0
	for k, n := range t.counts {
		if !strings.HasSuffix(k, "served") {
			s.row.clientErrors += n
		}
	}
	s.row.errorsNote = "probes during the flood"
	s.row.note("flood: ingress %d established (%d failed), egress %d established (%d failed); warden closed %d of them while held; "+
		"warden_listener_refused_total %v, warden_listener_accept_errors_total %v",
		floods[0].established, floods[0].failed, floods[1].established, floods[1].failed, closedByWarden, refused, acceptErrs)
	samePID := w.pid() == pid
	s.row.check("listeners-serve-again", len(servedAgain) == 2 && samePID,
		"after the flood: ingress served again %v, egress %v (after release); same process: %v; probes %v",
		at(servedAgain["ingress"], released), at(servedAgain["egress"], released), samePID, t.counts)
	s.row.check("readyz-truthful", t.lies == 0,
		"%d probes stalled (listener not accepting), %d of them while /readyz answered without a 503 naming it %s", t.stalled, t.lies, t.example)
	s.settle()
	return nil
}

// prober probes listeners on new connections, every 250 ms each, and
// keeps every answer.
type prober struct {
	mu      sync.Mutex
	probes  []listenerProbe
	running []*repeater
}

func probeListeners(ctx context.Context, eps []endpoint) *prober {
	pr := &prober{}
	for _, l := range eps {
		c := &http.Client{Timeout: probeTimeout, Transport: &http.Transport{DisableKeepAlives: true}}
		pr.running = append(pr.running, repeat(ctx, 250*time.Millisecond, func(ctx context.Context) {
			p := probeListener(ctx, c, l.name, l.addr, l.host)
			if ctx.Err() == nil {
				pr.mu.Lock()
				pr.probes = append(pr.probes, p)
				pr.mu.Unlock()
			}
		}))
	}
	return pr
}

// stop ends the probes; a second call does nothing.
func (pr *prober) stop() {
	for _, r := range pr.running {
		r.stop()
	}
}

// all is every probe so far, in the order they ended.
func (pr *prober) all() []listenerProbe {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return slices.Clone(pr.probes)
}

// servedAfter is, per listener, when the first probe sent after t was
// served a 200.
func (pr *prober) servedAfter(t time.Time) map[string]time.Time {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	served := map[string]time.Time{}
	for _, p := range pr.probes {
		if p.sent.After(t) && p.result == "served" && p.status == 200 && served[p.listener].IsZero() {
			served[p.listener] = p.done
		}
	}
	return served
}

// startFloods starts a flood of per idle connections to each address at
// once.
func (s *scenario) startFloods(addrs []string, per int) ([]*flooder, error) {
	floods := make([]*flooder, len(addrs))
	errs := make([]error, len(addrs))
	var wg sync.WaitGroup
	for i, addr := range addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			floods[i], errs[i] = s.startFlood(addr, per)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return floods, nil
}

// probeTally counts the probes by listener and result ("ingress served"),
// and the lies among them: a probe stalled (the listener was not
// accepting) while every /readyz answer in that time said 200, or did not
// name the listener.
type probeTally struct {
	counts        map[string]int
	stalled, lies int
	example       string // the first lie, told relative to released
}

func tallyProbes(probes []listenerProbe, ready *readyzPoller, released time.Time) probeTally {
	t := probeTally{counts: map[string]int{}}
	for _, p := range probes {
		t.counts[p.listener+" "+p.result]++
		if p.result != "stalled" {
			continue
		}
		t.stalled++
		rs := ready.between(p.sent, p.done.Add(100*time.Millisecond))
		told := false
		for _, r := range rs {
			if r.code == 503 && strings.Contains(r.body, p.listener) {
				told = true
			}
		}
		if len(rs) > 0 && !told {
			t.lies++
			if t.example == "" {
				t.example = fmt.Sprintf("(%s stalled %s while /readyz said %d %.80s)", p.listener,
					relative(p.sent, released, "the release"), rs[0].code, strings.TrimSpace(rs[0].body))
			}
		}
	}
	return t
}

// relative says when t was, before or after ref (named what).
func relative(t, ref time.Time, what string) string {
	d := t.Sub(ref).Round(time.Millisecond)
	if d < 0 {
		return fmt.Sprintf("%v before %s", -d, what)
	}
	return fmt.Sprintf("%v after %s", d, what)
}

// at is t after ref, or "never".
func at(t, ref time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.Sub(ref).Round(time.Millisecond).String()
}
