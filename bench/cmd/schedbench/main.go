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
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"
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
