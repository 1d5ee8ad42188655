// Command schedbench measures the run scheduler (make bench-scheduler):
// admissions per second and submit-to-start latency with the memory and
// bbolt stores, durable submits per second, memory with 1,000,000 queued
// runs, and the time from a freed slot to the next delivery. Beside each
// figure it prints the same run's baseline: a plain buffered Go channel
// handing the same work to the same worker. The ratio is what the gates,
// the index and the store cost.
//
// The worker is an in-process function (scheduler.Options.Deliver), the
// same one the baseline's goroutines call, so the figures are the
// scheduler's own cost, not HTTP's. Each comparison runs back to back and
// is repeated; the table shows medians.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
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

var (
	repeat      = flag.Int("repeat", 3, "repetitions of each comparison (medians are shown)")
	admitN      = flag.Int("admit-n", 200000, "runs drained per admission measurement")
	submitN     = flag.Int("submit-n", 100000, "runs per durable-submit measurement")
	queuedN     = flag.Int("queued-n", 1000000, "queued runs for the memory measurement")
	latRate     = flag.Int("lat-rate", 5000, "runs per second offered in the latency measurement")
	latN        = flag.Int("lat-n", 10000, "runs per latency measurement")
	slotN       = flag.Int("slot-n", 10000, "deliveries per freed-slot measurement")
	rssChild    = flag.String("rss-child", "", "internal: measure RSS holding queued runs in this store (bbolt, memory, chan)")
	lanesFlag   = flag.Int("lanes", 64, "lanes for the throughput measurements")
	measureFlag = flag.String("measure", "", "internal: run one measurement and print its values")
	only        = flag.String("only", "", "run one measurement (admit-memory, admit-bbolt, submit-memory, submit-bbolt, latency-bbolt, slot-bbolt) and print it; for profiling")
	cpuprof     = flag.String("cpuprofile", "", "write a CPU profile of -only to this file")
	mutexprof   = flag.String("mutexprofile", "", "write a mutex contention profile of -only to this file")
)

func main() {
	flag.Parse()
	switch {
	case *rssChild != "":
		rssMain(*rssChild, *queuedN)
		return
	case *measureFlag != "":
		child(*measureFlag)
		return
	case *only != "":
		runOnly(*only)
		return
	}
	fmt.Printf("scheduler bench: GOMAXPROCS=%d, %s, medians of %d runs, each in a fresh process; load average at start %s\nworker: the same in-process function for warden and for the baseline's goroutines\n\n",
		runtime.GOMAXPROCS(0), runtime.Version(), *repeat, loadavg())
	var rows []row
	for _, kind := range []string{"memory", "bbolt"} {
		w, b := compare("admit-"+kind, "admit-chan")
		rows = append(rows,
			row{fmt.Sprintf("admissions/s, %s store (lanes %d)", kind, *lanesFlag), w[0], b[0], perSec, goalFor("admit", kind)(w[0])},
			row{fmt.Sprintf("  CPU time per admission, %s store", kind), w[1], b[1], dur, ""})
		if kind == "memory" {
			// The wall-clock figure depends on how much of the machine the
			// process gets; CPU time per admission does not.
			procs := float64(runtime.GOMAXPROCS(0))
			rows = append(rows, row{fmt.Sprintf("  capacity if given all %d cores (cores ÷ CPU per admission)", runtime.GOMAXPROCS(0)),
				procs * 1e9 / w[1], procs * 1e9 / b[1], perSec, goalFor("admit", kind)(procs * 1e9 / w[1])})
		}
	}
	for _, kind := range []string{"memory", "bbolt"} {
		w, b := compare("submit-"+kind, "submit-chan")
		rows = append(rows, row{fmt.Sprintf("submits/s, %s store (256 callers%s)", kind, map[string]string{"bbolt": ", each durable"}[kind]), w[0], b[0], perSec, goalFor("submit", kind)(w[0])})
	}
	for _, kind := range []string{"memory", "bbolt"} {
		w, b := compare("latency-"+kind, "latency-chan")
		rows = append(rows,
			row{fmt.Sprintf("submit→start p50, %s store (%d/s offered)", kind, *latRate), w[0], b[0], dur, ""},
			row{fmt.Sprintf("submit→start p99, %s store", kind), w[1], b[1], dur, ""})
	}
	for _, kind := range []string{"memory", "bbolt"} {
		w, b := compare("slot-"+kind, "slot-chan")
		goal := goalMax("p99 ≤ 1ms", w[1], float64(time.Millisecond))
		rows = append(rows,
			row{fmt.Sprintf("freed slot→next delivery p50, %s store", kind), w[0], b[0], dur, ""},
			row{fmt.Sprintf("freed slot→next delivery p99, %s store", kind), w[1], b[1], dur, goal})
	}
	chanRSS := rssOf("chan", *queuedN)
	for _, kind := range []string{"bbolt", "memory"} {
		rss := rssOf(kind, *queuedN)
		goal := ""
		if kind == "bbolt" {
			goal = goalMax("≤ 300 MB", rss.RSS, 300e6)
		}
		label := fmt.Sprintf("RSS with %s queued runs, %s store", commas(float64(*queuedN)), kind)
		rows = append(rows, row{label, rss.RSS, chanRSS.RSS, bytesUnit, goal})
		if kind == "bbolt" {
			fmt.Printf("(bbolt: heap %.0f MB, mapped store file %.0f MB resident of %.0f MB)\n", rss.Heap/1e6, rss.RSSFile/1e6, rss.File/1e6)
		}
	}
	print(rows)
}

// compare runs the warden measurement and its baseline back to back, each
// in a fresh process, *repeat times, and returns the medians of each value.
func compare(warden, base string) ([]float64, []float64) {
	var ws, bs [][]float64
	for range *repeat {
		ws = append(ws, runChild(warden))
		bs = append(bs, runChild(base))
	}
	return medians(ws), medians(bs)
}

func medians(runs [][]float64) []float64 {
	out := make([]float64, len(runs[0]))
	for i := range out {
		var col []float64
		for _, r := range runs {
			col = append(col, r[i])
		}
		out[i] = median(col)
	}
	return out
}

func runChild(what string) []float64 {
	// Let the previous measurement's dirty pages reach the disk first, so
	// one bbolt figure does not pay for another's writeback.
	syscall.Sync()
	args := []string{"-measure", what, "-lanes", strconv.Itoa(*lanesFlag), "-admit-n", strconv.Itoa(*admitN),
		"-submit-n", strconv.Itoa(*submitN), "-lat-rate", strconv.Itoa(*latRate), "-lat-n", strconv.Itoa(*latN),
		"-slot-n", strconv.Itoa(*slotN)}
	out, err := exec.Command(os.Args[0], args...).Output()
	if err != nil {
		panic(fmt.Sprintf("measure %s: %v", what, err))
	}
	var v []float64
	if err := json.Unmarshal(out, &v); err != nil {
		panic(fmt.Sprintf("measure %s: %q: %v", what, out, err))
	}
	return v
}

// child runs one measurement and prints its values as a JSON array.
func child(what string) {
	var v []float64
	kind := what[strings.IndexByte(what, '-')+1:]
	chanSide := kind == "chan"
	switch {
	case strings.HasPrefix(what, "admit-"):
		var a, b float64
		if chanSide {
			a, b = chanAdmissions(*admitN, *lanesFlag)
		} else {
			n := *admitN
			if kind == "bbolt" {
				n /= 4 // each admission waits for a disk commit
			}
			a, b = admissions(kind, n, *lanesFlag)
		}
		v = []float64{a, b}
	case strings.HasPrefix(what, "submit-"):
		if chanSide {
			v = []float64{chanSubmits(*submitN, 256)}
		} else {
			v = []float64{submits(kind, *submitN, 256)}
		}
	case strings.HasPrefix(what, "latency-"):
		var a, b float64
		if chanSide {
			a, b = chanLatency(*latN, *latRate)
		} else {
			a, b = latency(kind, *latN, *latRate)
		}
		v = []float64{a, b}
	case strings.HasPrefix(what, "slot-"):
		var a, b float64
		if chanSide {
			a, b = chanFreedSlot(*slotN)
		} else {
			a, b = freedSlot(kind, *slotN)
		}
		v = []float64{a, b}
	default:
		panic("unknown measurement " + what)
	}
	json.NewEncoder(os.Stdout).Encode(v)
}

// ---- table

type unit int

const (
	perSec unit = iota
	dur
	bytesUnit
)

type row struct {
	label        string
	warden, base float64
	u            unit
	goal         string
}

func goalFor(what, kind string) func(float64) string {
	switch {
	case what == "admit" && kind == "memory":
		return func(v float64) string { return goalMin("≥ 200,000/s", v, 200000) }
	case what == "submit" && kind == "bbolt":
		return func(v float64) string { return goalMin("≥ 20,000/s", v, 20000) }
	}
	return func(float64) string { return "" }
}

func goalMin(goal string, v, min float64) string {
	if v >= min {
		return goal + " met"
	}
	return goal + " MISSED"
}

func goalMax(goal string, v, max float64) string {
	if goal == "" {
		return ""
	}
	if v <= max {
		return goal + " met"
	}
	return goal + " MISSED"
}

func format(v float64, u unit) string {
	switch u {
	case perSec:
		return commas(v) + "/s"
	case dur:
		d := time.Duration(v)
		switch {
		case d < time.Microsecond:
			return fmt.Sprintf("%dns", d.Nanoseconds())
		case d < time.Millisecond:
			return fmt.Sprintf("%.1fµs", float64(d)/1e3)
		}
		return fmt.Sprintf("%.2fms", float64(d)/1e6)
	}
	return fmt.Sprintf("%.0f MB", v/1e6)
}

func print(rows []row) {
	w := 0
	for _, r := range rows {
		w = max(w, len([]rune(r.label)))
	}
	fmt.Printf("%-*s  %14s  %16s  %9s  %s\n", w, "figure", "warden", "baseline (chan)", "ratio", "goal")
	for _, r := range rows {
		ratio := r.warden / r.base
		rs := fmt.Sprintf("%.2f×", ratio)
		if r.u == perSec {
			rs = fmt.Sprintf("%.3f×", ratio)
		}
		fmt.Printf("%-*s  %14s  %16s  %9s  %s\n", w+len(r.label)-len([]rune(r.label)), r.label, format(r.warden, r.u), format(r.base, r.u), rs, r.goal)
	}
	fmt.Println("\nratio = warden / baseline: the fraction of the channel's throughput kept, or how many times its latency or memory.")
}

func commas(v float64) string {
	s := strconv.FormatInt(int64(v+0.5), 10)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func percentile(d []time.Duration, p float64) float64 {
	s := slices.Clone(d)
	slices.Sort(s)
	return float64(s[min(len(s)-1, int(float64(len(s))*p))])
}

// ---- the scheduler under test

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
	gate := make(chan struct{})
	r := newRig(kind, 1, func(ctx context.Context, d scheduler.Delivery) scheduler.Reply {
		select {
		case <-gate:
		case <-ctx.Done():
		}
		return scheduler.Reply{Status: 200}
	})
	r.submit(input)
	start := time.Now()
	submitAll(n, callers, func(int) { r.submit(input) })
	el := time.Since(start)
	close(gate)
	r.close()
	return float64(n) / el.Seconds()
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

// ---- memory with a million queued runs, each measured in a fresh process

type rssResult struct {
	RSS     float64 `json:"rss"`
	RSSFile float64 `json:"rss_file"` // of which file-backed (the mapped store)
	Heap    float64 `json:"heap"`
	File    float64 `json:"file,omitempty"` // store file size
}

func rssOf(kind string, n int) rssResult {
	out, err := exec.Command(os.Args[0], "-rss-child", kind, "-queued-n", strconv.Itoa(n)).Output()
	if err != nil {
		panic(fmt.Sprintf("rss child %s: %v", kind, err))
	}
	var r rssResult
	if err := json.Unmarshal(out, &r); err != nil {
		panic(fmt.Sprintf("rss child %s: %q: %v", kind, out, err))
	}
	return r
}

func rssMain(kind string, n int) {
	var keep any
	switch kind {
	case "chan":
		ch := make(chan scheduler.Delivery, n)
		for i := range n {
			ch <- scheduler.Delivery{RunID: strconv.Itoa(i + 1), Name: "job", Attempt: 1, Input: append([]byte(nil), input...)}
		}
		keep = ch
	default:
		gate := make(chan struct{})
		r := newRig(kind, 1, func(ctx context.Context, d scheduler.Delivery) scheduler.Reply {
			select {
			case <-gate:
			case <-ctx.Done():
			}
			return scheduler.Reply{Status: 200}
		})
		submitAll(n+1, 512, func(int) { r.submit(append([]byte(nil), input...)) })
		keep = r
		defer func() { close(gate); r.close() }()
	}
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	res := rssResult{RSS: procStatus("VmRSS:"), RSSFile: procStatus("RssFile:"), Heap: float64(ms.HeapInuse)}
	if r, ok := keep.(*rig); ok && r.dir != "" {
		if fi, err := os.Stat(filepath.Join(r.dir, "runs.db")); err == nil {
			res.File = float64(fi.Size())
		}
	}
	json.NewEncoder(os.Stdout).Encode(res)
	runtime.KeepAlive(keep)
}

func procStatus(field string) float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == field {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb * 1024
		}
	}
	return 0
}

// drainProfile, when set, receives a CPU profile of an admission drain
// alone (not of the submissions that fill the queue).
var drainProfile *os.File

func runOnly(what string) {
	if *cpuprof != "" {
		f, err := os.Create(*cpuprof)
		if err != nil {
			panic(err)
		}
		if strings.HasPrefix(what, "admit-") {
			drainProfile = f
		} else {
			pprof.StartCPUProfile(f)
			defer pprof.StopCPUProfile()
		}
	}
	if *mutexprof != "" {
		runtime.SetMutexProfileFraction(1)
		defer func() {
			f, err := os.Create(*mutexprof)
			if err != nil {
				panic(err)
			}
			pprof.Lookup("mutex").WriteTo(f, 0)
			f.Close()
		}()
	}
	kind, _ := strings.CutPrefix(what[strings.IndexByte(what, '-')+1:], "")
	switch {
	case strings.HasPrefix(what, "admit-"):
		rate, cpu := admissions(kind, *admitN, *lanesFlag)
		fmt.Printf("%s: %s, CPU %s per admission\n", what, format(rate, perSec), format(cpu, dur))
	case strings.HasPrefix(what, "submit-"):
		fmt.Printf("%s: %s\n", what, format(submits(kind, *submitN, 256), perSec))
	case strings.HasPrefix(what, "latency-"):
		a, b := latency(kind, *latN, *latRate)
		fmt.Printf("%s: p50 %s p99 %s\n", what, format(a, dur), format(b, dur))
	case strings.HasPrefix(what, "slot-"):
		a, b := freedSlot(kind, *slotN)
		fmt.Printf("%s: p50 %s p99 %s\n", what, format(a, dur), format(b, dur))
	default:
		fmt.Println("unknown -only", what)
	}
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
