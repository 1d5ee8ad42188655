package main

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/warden-dev/warden/bench/loadgen"
)

// addrs are a scenario's listener addresses, free a moment ago.
type addrs struct{ admin, ingress, egress, bridge, other string }

func freeAddrs() (addrs, error) {
	p, err := freePorts(5)
	if err != nil {
		return addrs{}, err
	}
	return addrs{admin: p[0], ingress: p[1], egress: p[2], bridge: p[3], other: p[4]}, nil
}

// policyFor is a scenario's policy: the lines every one shares, then body.
func policyFor(admin, body string) string {
	return "version: 1\nshutdown_grace: 5s\nadmin: { listen: " + admin + " }\n" + body
}

// launch writes policy, runs warden on it (with RLIMIT_NOFILE nofile when
// it is not 0), stops it when the scenario ends, and starts sampling its
// resources.
func (s *scenario) launch(ctx context.Context, policy, admin string, nofile int) (*warden, error) {
	w, err := s.newWarden(policy, admin)
	if err != nil {
		return nil, err
	}
	w.nofile = nofile
	if err := w.start(ctx); err != nil {
		return nil, err
	}
	s.later(w.stop)
	s.watch(ctx, w)
	return w, nil
}

// prepare starts the harness's worker (holding each run delivery for
// hold) and picks the scenario's listener addresses.
func (s *scenario) prepare(hold time.Duration) (*worker, addrs, error) {
	wk, err := s.worker(hold)
	if err != nil {
		return nil, addrs{}, err
	}
	a, err := freeAddrs()
	return wk, a, err
}

// worker starts the harness's worker, closed when the scenario ends.
func (s *scenario) worker(hold time.Duration) (*worker, error) {
	wk, err := startWorker(hold)
	if err != nil {
		return nil, err
	}
	s.later(wk.close)
	return wk, nil
}

// later runs f when the scenario ends (last registered, first run), before
// the sweep of its processes.
func (s *scenario) later(f func()) { s.cleanups = append(s.cleanups, f) }

// repeater runs a function now and then at a fixed interval until stopped.
type repeater struct {
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

func repeat(ctx context.Context, every time.Duration, fn func(ctx context.Context)) *repeater {
	ctx, cancel := context.WithCancel(ctx)
	r := &repeater{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			fn(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return r
}

// stop ends the repetition and waits for the call in progress; what the
// function recorded may be read afterwards.
func (r *repeater) stop() {
	r.once.Do(func() {
		r.cancel()
		<-r.done
	})
}

// waitFor asks cond every 100 ms until it holds (true), limit passes or
// ctx ends (false).
func waitFor(ctx context.Context, limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) || !sleep(ctx, 100*time.Millisecond) {
			return false
		}
	}
}

// firstAfter is the first of ts (sorted) after t, or the zero time.
func firstAfter(ts []time.Time, t time.Time) time.Time {
	i := sort.Search(len(ts), func(i int) bool { return ts[i].After(t) })
	if i == len(ts) {
		return time.Time{}
	}
	return ts[i]
}

// endpoint is a data-plane listener as a client reaches it.
type endpoint struct{ name, addr, host string }

// goodClients runs the repo's load generator (bench/loadgen) against each
// endpoint at once, open loop at rate per second on conns connections,
// for d or until ctx ends: a well-behaved client beside the fault.
func goodClients(ctx context.Context, eps []endpoint, rate float64, conns int, d time.Duration) []*loadgen.Result {
	res := make([]*loadgen.Result, len(eps))
	var wg sync.WaitGroup
	for i, e := range eps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Run returns ctx's error when ctx ends first; the figures
			// measured until then are what counts.
			res[i], _ = loadgen.Run(ctx, loadgen.Config{Addr: e.addr, Host: e.host, Path: "/good",
				Header: map[string]string{"x-tenant-id": "good"}, Concurrency: conns, Rate: rate, Duration: d})
		}()
	}
	wg.Wait()
	return res
}

// checkServed records, per endpoint, that its well-behaved client got only
// 2xx answers, and returns the errors in all.
func (r *row) checkServed(name string, eps []endpoint, res []*loadgen.Result) int {
	errs := 0
	for i, e := range eps {
		g := res[i]
		if g == nil {
			r.check(name+"-"+e.name, false, "no result")
			continue
		}
		errs += int(g.Errors)
		r.check(name+"-"+e.name, g.Errors == 0 && g.Total > 0, "%d served, %d errors %s", g.Total, g.Errors, firstOf(g.FirstError))
	}
	return errs
}

// errNote is " (err)", or nothing without an error.
func errNote(err error) string {
	if err == nil {
		return ""
	}
	return fmt.Sprintf(" (%v)", err)
}

func firstOf(err string) string {
	if err == "" {
		return ""
	}
	return fmt.Sprintf("(first: %.120s)", err)
}
