package main

import (
	"fmt"
	"os"

	"github.com/warden-dev/warden/internal/gcfloor"
)

type row struct {
	label    string
	procs    int
	r        result
	note     string  // printed instead of the figures: why the row has none
	minRate  float64 // goal; 0: none
	maxP99ms float64 // goal; 0: none
}

// comparison is warden's RLS (Redis windows) against envoyproxy/ratelimit
// in one round, under the same load generator.
type comparison struct {
	client        string // "h2" or "grpc"
	warden, other result
	err           error // why envoyproxy/ratelimit has no figure
}

var clientName = map[string]string{"h2": "lean HTTP/2 load", "grpc": "grpc-go load"}

// admitRows are the shared-window admissions through Redis.
func admitRows(o options) []row {
	one := children(o, 1, "admit")[0]
	base := children(o, 1, "baseline")[0]
	three := children(o, 3, "admit")
	sum := result{Seconds: o.duration.Seconds()}
	for _, r := range three {
		sum.Ops += r.Ops
		sum.Errors += r.Errors
		sum.P50 = max(sum.P50, r.P50)
		sum.P99 = max(sum.P99, r.P99)
		sum.CPU += r.CPU
	}
	return []row{
		{label: "shared admissions (Take via Redis)", procs: 1, r: one, minRate: 50000, maxP99ms: 2},
		{label: "  baseline: INCRBY+EXPIRE per decision", procs: 1, r: base},
		{label: "shared admissions, 3 sidecars (sum)", procs: 3, r: sum},
	}
}

// rlsRows are warden's RLS with memory and Redis windows, then
// envoyproxy/ratelimit with the same Redis, each generator in turn.
func rlsRows(o options) ([]row, []comparison) {
	mem := withRLS(o, "memory", "h2")
	rows := []row{{label: "RLS ShouldRateLimit, memory windows", procs: 1, r: mem}}
	var cmp []comparison
	for _, client := range []string{"h2", "grpc"} {
		c := comparison{client: client, warden: withRLS(o, "redis", client)}
		c.other, c.err = withRatelimit(o, client)
		cmp = append(cmp, c)
	}
	rows = append(rows,
		row{label: "RLS ShouldRateLimit, Redis windows", procs: 1, r: cmp[0].warden, minRate: 30000},
		row{label: "  same, grpc-go client as load generator", procs: 1, r: cmp[1].warden})
	for i, c := range cmp {
		label := "envoyproxy/ratelimit, Redis (baseline)"
		if i > 0 {
			label = "  same, grpc-go client as load generator"
		}
		r := row{label: label, procs: 1, r: c.other}
		if c.err != nil {
			r.note = "not run: " + c.err.Error()
		}
		rows = append(rows, r)
	}
	return rows, cmp
}

// printRound prints one round's table and says whether a goal was missed.
func printRound(round int, ceil float64, rows []row) (failed bool) {
	fmt.Printf("round %d — ceiling: redis-benchmark -t incr -q = %.0f INCR/s (50 clients, one command per round trip)\n", round, ceil)
	fmt.Printf("%-40s %5s %12s %8s %8s %7s %10s %10s %9s  %s\n", "path", "procs", "decisions/s", "p50 ms", "p99 ms", "errors", "CPU µs/dec", "Redis µs", "vs INCR", "goal")
	for _, r := range rows {
		if r.note != "" {
			fmt.Printf("%-40s %5d  %s\n", r.label, r.procs, r.note)
			continue
		}
		goal, met := "", true
		if r.minRate > 0 {
			goal = fmt.Sprintf("≥%.0f/s", r.minRate)
			met = r.r.rate() >= r.minRate
		}
		if r.maxP99ms > 0 {
			goal += fmt.Sprintf(", p99≤%gms", r.maxP99ms)
			met = met && r.r.P99 <= r.maxP99ms
		}
		if r.r.Errors > 0 {
			met = false
		}
		if goal != "" {
			if met {
				goal += ": met"
			} else {
				goal += ": NOT met"
				failed = true
			}
		}
		redis := "-"
		if r.r.RedisCPU > 0 {
			redis = fmt.Sprintf("%.1f", perOp(r.r.RedisCPU, r.r))
		}
		fmt.Printf("%-40s %5d %12.0f %8.2f %8.2f %7d %10.1f %10s %8.2f×  %s\n", r.label, r.procs, r.r.rate(), r.r.P50, r.r.P99, r.r.Errors, perOp(r.r.CPU, r.r), redis, r.r.rate()/ceil, goal)
	}
	fmt.Println()
	return failed
}

// perOp is seconds spread over r's decisions, in µs.
func perOp(seconds float64, r result) float64 {
	if r.Ops == 0 {
		return 0
	}
	return seconds * 1e6 / float64(r.Ops)
}

// printComparisons prints one round's warden ÷ envoyproxy/ratelimit.
func printComparisons(cmp []comparison) {
	for _, c := range cmp {
		if c.err != nil || c.other.Ops == 0 || c.warden.Ops == 0 {
			fmt.Printf("warden ÷ envoyproxy/ratelimit, %s: not compared (%v)\n", clientName[c.client], c.err)
			continue
		}
		w, e := perOp(c.warden.CPU, c.warden), perOp(c.other.CPU, c.other)
		fmt.Printf("warden ÷ envoyproxy/ratelimit, %s: %.2f× calls/s, %.2f× server CPU per call (%.1f vs %.1f µs)\n",
			clientName[c.client], c.warden.rate()/c.other.rate(), w/e, w, e)
	}
	if len(cmp) > 0 {
		fmt.Println()
	}
}

// printMedians prints the ratios' medians over the rounds that have both.
func printMedians(all []comparison, rounds int) {
	for _, client := range []string{"h2", "grpc"} {
		var rate, cpu, w, e []float64
		for _, c := range all {
			if c.client != client || c.err != nil || c.other.Ops == 0 || c.warden.Ops == 0 {
				continue
			}
			wc, ec := perOp(c.warden.CPU, c.warden), perOp(c.other.CPU, c.other)
			rate, cpu = append(rate, c.warden.rate()/c.other.rate()), append(cpu, wc/ec)
			w, e = append(w, wc), append(e, ec)
		}
		if len(rate) == 0 {
			continue
		}
		fmt.Printf("median of %d of %d rounds, warden ÷ envoyproxy/ratelimit, %s: %.2f× calls/s, %.2f× server CPU per call (%.1f vs %.1f µs)\n",
			len(rate), rounds, clientName[client], median(rate), median(cpu), median(w), median(e))
	}
	fmt.Println()
}

func printFooter() {
	fmt.Println("vs INCR = decisions/s ÷ the same round's redis-benchmark INCR/s. Every admission is one window take")
	fmt.Println("(admitted: the limits are out of reach, so no answer comes from the local over-limit cache). The 3-sidecar")
	fmt.Println("row runs three processes at once on one Redis; its p50/p99 are the worst of the three. decisions/s counts")
	fmt.Println("successful decisions only; errors are decisions the backend did not make (fail_closed: a timeout or an")
	fmt.Println("open breaker). CPU µs/dec is the deciding process's CPU time per decision (the RLS server's for RLS rows;")
	fmt.Println("Redis's and the load generator's time are not in it): it holds on a busy machine where decisions/s does not.")
	fmt.Println("Redis µs (RLS rows) is Redis's own CPU time (INFO cpu) over the measured span per decision: it includes")
	fmt.Println("whatever else that Redis served meanwhile.")
	fmt.Println("RLS load: a lean HTTP/2 gRPC client (raw frames, like Envoy's C++ client) unless the row says grpc-go; the")
	fmt.Println("load generator runs on the same cores as the server and Redis.")
	fmt.Println("envoyproxy/ratelimit: its server (src/service_cmd) built from its Go module by `make bench-rls`, with its")
	fmt.Println("README's settings (USE_STATSD=false, REDIS_SOCKET_TYPE=tcp, REDIS_URL, RUNTIME_ROOT/SUBDIRECTORY), stats in")
	fmt.Println("its Prometheus sink (USE_PROMETHEUS=true: in memory, as warden's /metrics) and its defaults otherwise")
	fmt.Println("(REDIS_POOL_SIZE 10; -ratelimit-env adds settings); its config: domain bench, key tenant, 2,000,000,000 per")
	fmt.Println("hour, as warden's policy. It sends INCRBY+EXPIRE in one round trip per call, as the admission baseline row does.")
	if os.Getenv("GOGC") == "" {
		fmt.Printf("GC: warden's processes and the load generator keep `warden run`'s %d MiB heap-goal floor (internal/gcfloor);\n", gcfloor.Default>>20)
		fmt.Println("the INCR+EXPIRE baseline and envoyproxy/ratelimit run with Go's default GOGC. Set GOGC to run every")
		fmt.Println("process with that value instead.")
	} else {
		fmt.Printf("GC: every process with GOGC=%s (the environment's; no heap-goal floor).\n", os.Getenv("GOGC"))
	}
}
