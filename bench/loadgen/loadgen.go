// Package loadgen is warden's HTTP load generator: a fasthttp client with
// a fixed number of workers, each on its own keep-alive connection, in one
// of two modes. Closed loop (Rate 0) sends the next request as soon as the
// previous one answers and measures throughput. Open loop (Rate > 0) sends
// on a fixed schedule and measures latency from the scheduled time when the
// worker was held up by a slow response, so queueing behind slow responses
// is counted (no coordinated omission), but not the generator's own timer
// lateness. Latencies go into HDR-style log-linear histograms.
package loadgen

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// Config is one run.
type Config struct {
	Addr   string            // host:port to connect to
	Host   string            // Host header (default Addr)
	Path   string            // origin-form request target (default "/")
	Header map[string]string // extra request headers
	// Concurrency is the number of workers, each with one connection.
	Concurrency int
	// Rate is the open-loop request rate per second; 0 runs closed loop.
	Rate float64
	// Warmup runs before measuring; Duration is measured.
	Warmup, Duration time.Duration
	// Timeout bounds each request (default 5 s).
	Timeout time.Duration
}

// Result is what a run measured, over the measured window only.
type Result struct {
	Requests   uint64 // answered with 2xx within the window
	Total      uint64 // answered with 2xx, warm-up included
	Errors     uint64 // transport errors and non-2xx answers
	Elapsed    time.Duration
	RPS        float64
	Latency    Histogram
	FirstError string
}

// Run drives cfg's load until done or ctx ends.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if cfg.Concurrency <= 0 {
		return nil, errors.New("loadgen: concurrency must be positive")
	}
	if cfg.Path == "" {
		cfg.Path = "/"
	}
	if cfg.Host == "" {
		cfg.Host = cfg.Addr
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	hc := &fasthttp.HostClient{
		Addr:                      cfg.Addr,
		MaxConns:                  cfg.Concurrency,
		MaxIdemponentCallAttempts: 1,
		ReadTimeout:               cfg.Timeout,
		WriteTimeout:              cfg.Timeout,
		NoDefaultUserAgentHeader:  true,
	}
	defer hc.CloseIdleConnections()
	start := time.Now()
	measureFrom := start.Add(cfg.Warmup)
	end := measureFrom.Add(cfg.Duration)
	workers := make([]worker, cfg.Concurrency)
	var wg sync.WaitGroup
	for i := range workers {
		w := &workers[i]
		w.cfg, w.hc, w.from, w.end = &cfg, hc, measureFrom, end
		if cfg.Rate > 0 {
			w.interval = time.Duration(float64(time.Second) * float64(cfg.Concurrency) / cfg.Rate)
			// Stagger the workers evenly over one interval.
			w.next = start.Add(w.interval * time.Duration(i) / time.Duration(cfg.Concurrency))
		}
		wg.Add(1)
		go func() { defer wg.Done(); w.run(ctx) }()
	}
	wg.Wait()
	res := &Result{Elapsed: cfg.Duration}
	for i := range workers {
		w := &workers[i]
		res.Requests += w.ok
		res.Total += w.all
		res.Errors += w.errs
		res.Latency.Merge(&w.hist)
		if res.FirstError == "" {
			res.FirstError = w.firstErr
		}
	}
	if now := time.Now(); now.Before(end) {
		res.Elapsed = max(now.Sub(measureFrom), 0)
	}
	if res.Elapsed > 0 {
		res.RPS = float64(res.Requests) / res.Elapsed.Seconds()
	}
	return res, ctx.Err()
}

type worker struct {
	cfg      *Config
	hc       *fasthttp.HostClient
	from     time.Time
	end      time.Time
	interval time.Duration // open loop only
	next     time.Time     // open loop: when the next request is due

	hist     Histogram
	ok, errs uint64
	all      uint64 // 2xx answers, warm-up included
	firstErr string
}

func (w *worker) run(ctx context.Context) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(w.cfg.Path)
	req.Header.SetHost(w.cfg.Host)
	for k, v := range w.cfg.Header {
		req.Header.Set(k, v)
	}
	var timer *time.Timer
	if w.interval > 0 {
		timer = time.NewTimer(time.Hour)
		defer timer.Stop()
	}
	behind := false // the previous response came back after this request was due
	for ctx.Err() == nil {
		var sent time.Time
		if w.interval > 0 {
			if wait := time.Until(w.next); wait > 0 {
				timer.Reset(wait)
				select {
				case <-timer.C:
				case <-ctx.Done():
					return
				}
			}
			sent = time.Now()
			if behind {
				sent = w.next
			}
		} else {
			sent = time.Now()
		}
		if sent.After(w.end) {
			return
		}
		err := w.hc.DoTimeout(req, resp, w.cfg.Timeout)
		done := time.Now()
		if w.interval > 0 {
			w.next = w.next.Add(w.interval)
			behind = done.After(w.next)
		}
		if err == nil && resp.StatusCode() >= 200 && resp.StatusCode() <= 299 {
			w.all++
		}
		if sent.Before(w.from) || done.After(w.end) {
			continue // warm-up, or past the window
		}
		switch {
		case err != nil:
			w.fail(err.Error())
		case resp.StatusCode() < 200 || resp.StatusCode() > 299:
			w.fail(fmt.Sprintf("status %d: %.200s", resp.StatusCode(), resp.Body()))
		default:
			w.ok++
			w.hist.Record(done.Sub(sent))
		}
	}
}

func (w *worker) fail(msg string) {
	w.errs++
	if w.firstErr == "" {
		w.firstErr = msg
	}
}
