package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/warden-dev/warden/governor"
	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/window"
	"github.com/warden-dev/warden/policy"
	"github.com/warden-dev/warden/scheduler"
	"github.com/warden-dev/warden/scheduler/store"
)

// The measurements: each runs the scheduler under test (a rig) and, in
// a function of the same name prefixed chan, the channel baseline.

// rig is a scheduler with one definition and an in-process worker.
type rig struct {
	sched *scheduler.Scheduler
	st    store.Store
	dir   string
}

func newRig(kind string, lanes int, deliver scheduler.DeliverFunc) *rig {
	p, err := policy.Parse("bench.yaml", []byte(fmt.Sprintf(`version: 1
ingress: { listen: 127.0.0.1:0, worker: http://127.0.0.1:9 }
scheduler:
  lanes: %d
  worker_max_concurrent: %d
  definitions:
    job: {}
`, lanes, lanes)))
	if err != nil {
		panic(err)
	}
	clk := clock.Real{}
	c := governor.New(clk, nil, window.NewMemory(clk)).Apply(p)
	r := &rig{}
	switch kind {
	case "memory":
		r.st = store.NewMemory()
	case "bbolt":
		r.dir, err = os.MkdirTemp("", "schedbench")
		if err != nil {
			panic(err)
		}
		if r.st, err = store.OpenBolt(filepath.Join(r.dir, "runs.db")); err != nil {
			panic(err)
		}
	}
	r.sched = scheduler.New(scheduler.Options{Clock: clk, Store: r.st, Deliver: deliver})
	if err := r.sched.Apply(context.Background(), c); err != nil {
		panic(err)
	}
	return r
}

func (r *rig) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.sched.Shutdown(ctx); err != nil {
		panic(err)
	}
	r.st.Close()
	if r.dir != "" {
		os.RemoveAll(r.dir)
	}
	runtime.GC()
}

func (r *rig) submit(input []byte) {
	if _, _, err := r.sched.Submit(context.Background(), scheduler.SubmitRequest{Name: "job", Input: input}); err != nil {
		panic(err)
	}
}

// submitAll submits n runs from callers goroutines.
func submitAll(n, callers int, submit func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				submit(i)
			}
		}()
	}
	wg.Wait()
}

var input = []byte(`{"tenantId":"acme","orderId":1234567}`)

// admissions: lanes runs hold the worker while n more queue behind them;
// then the worker lets go and the time to drain the queue is measured.
func admissions(kind string, n, lanes int) (perSec, cpuPerRun float64) {
	gate := make(chan struct{})
	var done atomic.Int64
	finished := make(chan time.Time, 1)
	total := int64(n + lanes)
	r := newRig(kind, lanes, func(ctx context.Context, d scheduler.Delivery) scheduler.Reply {
		<-gate
		if done.Add(1) == total {
			finished <- time.Now()
		}
		return scheduler.Reply{Status: 200}
	})
	defer r.close()
	submitAll(n+lanes, 64, func(int) { r.submit(input) })
	runtime.GC()
	if drainProfile != nil {
		pprof.StartCPUProfile(drainProfile)
		defer pprof.StopCPUProfile()
	}
	cpu0 := cpuTime()
	start := time.Now()
	close(gate)
	end := <-finished
	return float64(n) / end.Sub(start).Seconds(), float64(cpuTime()-cpu0) / float64(n)
}

// cpuTime is the CPU time (user + system) the process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// chanAdmissions: the same drain from a buffered channel by lanes
// goroutines calling the same worker.
func chanAdmissions(n, lanes int) (perSec, cpuPerRun float64) {
	ch := make(chan scheduler.Delivery, n)
	for i := range n {
		ch <- scheduler.Delivery{RunID: strconv.Itoa(i), Name: "job", Attempt: 1, Input: input}
	}
	close(ch)
	worker := func(ctx context.Context, d scheduler.Delivery) scheduler.Reply { return scheduler.Reply{Status: 200} }
	runtime.GC()
	cpu0 := cpuTime()
	start := time.Now()
	var wg sync.WaitGroup
	for range lanes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for d := range ch {
				worker(context.Background(), d)
			}
		}()
	}
	wg.Wait()
	return float64(n) / time.Since(start).Seconds(), float64(cpuTime()-cpu0) / float64(n)
}

// submits: n runs from callers goroutines while nothing is admitted (one
// run holds the only lane), so the figure is the submit path alone.
func submits(kind string, n, callers int) float64 {
	r, release := blockedRig(kind)
	r.submit(input)
	start := time.Now()
	submitAll(n, callers, func(int) { r.submit(input) })
	el := time.Since(start)
	release()
	return float64(n) / el.Seconds()
}

// blockedRig is a rig of one lane whose worker holds every delivery until
// release, which also closes the rig: the first run submitted takes the
// lane, and every later one stays queued.
func blockedRig(kind string) (r *rig, release func()) {
	gate := make(chan struct{})
	r = newRig(kind, 1, func(ctx context.Context, d scheduler.Delivery) scheduler.Reply {
		select {
		case <-gate:
		case <-ctx.Done():
		}
		return scheduler.Reply{Status: 200}
	})
	return r, func() { close(gate); r.close() }
}

func chanSubmits(n, callers int) float64 {
	ch := make(chan scheduler.Delivery, n)
	start := time.Now()
	submitAll(n, callers, func(i int) {
		ch <- scheduler.Delivery{RunID: strconv.Itoa(i), Name: "job", Attempt: 1, Input: input}
	})
	return float64(n) / time.Since(start).Seconds()
}

// latency offers rate runs per second (paced by 16 goroutines) to a
// scheduler with free lanes and measures submit→worker.
func latency(kind string, n, rate int) (p50, p99 float64) {
	sent := make([]int64, n)
	lat := make([]time.Duration, n)
	var got sync.WaitGroup
	got.Add(n)
	r := newRig(kind, 64, func(ctx context.Context, d scheduler.Delivery) scheduler.Reply {
		i, _ := strconv.Atoi(string(d.Input))
		lat[i] = time.Duration(time.Now().UnixNano() - atomic.LoadInt64(&sent[i]))
		got.Done()
		return scheduler.Reply{Status: 200}
	})
	defer r.close()
	pace(n, rate, func(i int) {
		atomic.StoreInt64(&sent[i], time.Now().UnixNano())
		r.submit([]byte(strconv.Itoa(i)))
	})
	got.Wait()
	return percentile(lat, 0.50), percentile(lat, 0.99)
}

func chanLatency(n, rate int) (p50, p99 float64) {
	type item struct {
		i  int
		at time.Time
	}
	ch := make(chan item, n)
	lat := make([]time.Duration, n)
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for it := range ch {
				lat[it.i] = time.Since(it.at)
			}
		}()
	}
	pace(n, rate, func(i int) { ch <- item{i, time.Now()} })
	close(ch)
	wg.Wait()
	return percentile(lat, 0.50), percentile(lat, 0.99)
}

// pace calls f(i) for i < n at rate per second from 16 goroutines.
func pace(n, rate int, f func(i int)) {
	const senders = 16
	interval := time.Duration(float64(time.Second) * senders / float64(rate))
	var wg sync.WaitGroup
	start := time.Now()
	for s := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; ; k++ {
				i := k*senders + s
				if i >= n {
					return
				}
				if d := time.Until(start.Add(time.Duration(k) * interval)); d > 0 {
					time.Sleep(d)
				}
				f(i)
			}
		}()
	}
	wg.Wait()
}

// freedSlot: one lane, a queue of n runs; the gap between one delivery
// returning and the next one entering the worker.
func freedSlot(kind string, n int) (p50, p99 float64) {
	gate := make(chan struct{})
	enter := make([]int64, 0, n+1)
	leave := make([]int64, 0, n+1)
	var mu sync.Mutex
	var got sync.WaitGroup
	got.Add(n + 1)
	r := newRig(kind, 1, func(ctx context.Context, d scheduler.Delivery) scheduler.Reply {
		<-gate
		mu.Lock()
		enter = append(enter, time.Now().UnixNano())
		mu.Unlock()
		defer func() {
			mu.Lock()
			leave = append(leave, time.Now().UnixNano())
			mu.Unlock()
			got.Done()
		}()
		return scheduler.Reply{Status: 200}
	})
	defer r.close()
	submitAll(n+1, 64, func(int) { r.submit(input) })
	close(gate)
	got.Wait()
	gaps := make([]time.Duration, 0, n)
	for i := 1; i < len(enter); i++ {
		gaps = append(gaps, time.Duration(enter[i]-leave[i-1]))
	}
	return percentile(gaps, 0.50), percentile(gaps, 0.99)
}

func chanFreedSlot(n int) (p50, p99 float64) {
	ch := make(chan scheduler.Delivery, n+1)
	for i := range n + 1 {
		ch <- scheduler.Delivery{RunID: strconv.Itoa(i), Input: input}
	}
	close(ch)
	gaps := make([]time.Duration, 0, n)
	var last int64
	for d := range ch {
		now := time.Now().UnixNano()
		if last != 0 {
			gaps = append(gaps, time.Duration(now-last))
		}
		_ = d
		last = time.Now().UnixNano()
	}
	return percentile(gaps, 0.50), percentile(gaps, 0.99)
}
