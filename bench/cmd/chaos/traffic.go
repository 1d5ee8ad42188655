package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// offer calls fn(n) for n = 1, 2, … from conns goroutines until ctx ends,
// and returns once every call has returned. With rate > 0 the calls are
// offered at that rate in all (open loop; an offer that finds every
// goroutine busy is dropped rather than queued); with rate 0 each goroutine
// calls again as soon as its call returns (closed loop).
func offer(ctx context.Context, rate float64, conns int, fn func(n int)) {
	var wg sync.WaitGroup
	if rate <= 0 {
		var n atomic.Int64
		for range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					fn(int(n.Add(1)))
				}
			}()
		}
		wg.Wait()
		return
	}
	tokens := make(chan int, conns)
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range tokens {
				fn(n)
			}
		}()
	}
	t := time.NewTicker(time.Duration(float64(time.Second) / rate))
	n := 0
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-t.C:
			n++
			select {
			case tokens <- n:
			default:
			}
		}
	}
	t.Stop()
	close(tokens)
	wg.Wait()
}

// outcome is what one request got: a status and the control warden named
// (x-warden-control), or a transport error (status 0).
type outcome struct {
	sent    time.Time
	at      time.Time // when the answer (or the error) came
	status  int
	control string
	err     string
}

func (o outcome) class() string {
	switch {
	case o.status == 0:
		return "no answer"
	case o.control != "":
		return fmt.Sprintf("%d %s", o.status, o.control)
	default:
		return fmt.Sprint(o.status)
	}
}

// trafficConfig is one stream of requests through a listener.
type trafficConfig struct {
	addr, host, path string
	header           map[string]string
	conns            int
	rate             float64       // per second in all; 0: closed loop
	timeout          time.Duration // per request (default 5 s)
	// perRequest, when set, sets headers that differ per request.
	perRequest func(req *fasthttp.Request, n int)
	// keep every outcome (for phase-by-phase checks); else counts only.
	keep bool
	// warmup runs closed loop first, so that every connection (the
	// client's and warden's upstream ones) is open before the steady load:
	// a soak's trend then shows leaks, not pools filling up.
	warmup time.Duration
}

// traffic is a running stream: it classifies every answer.
type traffic struct {
	mu     sync.Mutex
	outs   []outcome
	counts map[string]int
	total  int
	first  string // the first transport error
	done   chan struct{}
	cancel context.CancelFunc
}

func startTraffic(ctx context.Context, cfg trafficConfig) *traffic {
	ctx, cancel := context.WithCancel(ctx)
	t := &traffic{counts: map[string]int{}, done: make(chan struct{}), cancel: cancel}
	if cfg.timeout == 0 {
		cfg.timeout = 5 * time.Second
	}
	if cfg.host == "" {
		cfg.host = cfg.addr
	}
	if cfg.path == "" {
		cfg.path = "/"
	}
	hc := &fasthttp.HostClient{Addr: cfg.addr, MaxConns: cfg.conns, MaxIdemponentCallAttempts: 1,
		ReadTimeout: cfg.timeout, WriteTimeout: cfg.timeout, NoDefaultUserAgentHeader: true, MaxIdleConnDuration: time.Hour}
	go func() {
		defer close(t.done)
		defer hc.CloseIdleConnections()
		send := func(n int) {
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			req.SetRequestURI(cfg.path)
			req.Header.SetHost(cfg.host)
			for k, v := range cfg.header {
				req.Header.Set(k, v)
			}
			if cfg.perRequest != nil {
				cfg.perRequest(req, n)
			}
			sent := time.Now()
			err := hc.DoTimeout(req, resp, cfg.timeout)
			o := outcome{sent: sent, at: time.Now()}
			if err != nil {
				o.err = err.Error()
			} else {
				o.status = resp.StatusCode()
				o.control = string(resp.Header.Peek("x-warden-control"))
			}
			t.record(o, cfg.keep)
		}
		if cfg.warmup > 0 {
			wctx, cancel := context.WithTimeout(ctx, cfg.warmup)
			offer(wctx, 0, cfg.conns, send)
			cancel()
		}
		offer(ctx, cfg.rate, cfg.conns, send)
	}()
	return t
}

func (t *traffic) record(o outcome, keep bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.total++
	t.counts[o.class()]++
	if o.status == 0 && t.first == "" {
		t.first = o.err
	}
	if keep {
		t.outs = append(t.outs, o)
	}
}

// stop ends the stream and waits for the requests in flight.
func (t *traffic) stop() {
	t.cancel()
	<-t.done
}

// between is the kept outcomes of the requests sent at or after from and
// answered before to.
func (t *traffic) between(from, to time.Time) []outcome {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []outcome
	for _, o := range t.outs {
		if !o.sent.Before(from) && o.at.Before(to) {
			out = append(out, o)
		}
	}
	return out
}

// firstOK is when the first request sent after t was answered 200 (zero
// if none was).
func (t *traffic) firstOK(after time.Time) time.Time {
	for _, o := range t.between(after, time.Now().Add(time.Hour)) {
		if o.status == 200 {
			return o.at
		}
	}
	return time.Time{}
}

// errors counts the answers that were not 2xx, transport errors included.
func (t *traffic) errors() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for c, k := range t.counts {
		if !strings.HasPrefix(c, "2") {
			n += k
		}
	}
	return n
}

// lost counts the requests that got no answer at all.
func (t *traffic) lost() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.counts["no answer"]
}

// classes is a copy of the counts by class.
func (t *traffic) classes() map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := make(map[string]int, len(t.counts))
	for k, v := range t.counts {
		m[k] = v
	}
	return m
}

// summary lists the classes of answers with their counts, largest first.
func (t *traffic) summary() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return summarize(t.counts, t.first)
}

func summarize(counts map[string]int, firstErr string) string {
	type kv struct {
		k string
		v int
	}
	var kvs []kv
	for k, v := range counts {
		kvs = append(kvs, kv{k, v})
	}
	sort.Slice(kvs, func(i, j int) bool { return kvs[i].v > kvs[j].v || kvs[i].v == kvs[j].v && kvs[i].k < kvs[j].k })
	var parts []string
	for _, e := range kvs {
		parts = append(parts, fmt.Sprintf("%s ×%d", e.k, e.v))
	}
	s := strings.Join(parts, ", ")
	if firstErr != "" {
		s += fmt.Sprintf(" (first transport error: %.120s)", firstErr)
	}
	if s == "" {
		return "none"
	}
	return s
}

// classesOf counts outcomes by class.
func classesOf(os []outcome) map[string]int {
	m := map[string]int{}
	for _, o := range os {
		m[o.class()]++
	}
	return m
}
