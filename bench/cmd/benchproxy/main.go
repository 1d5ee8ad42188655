// Command benchproxy is `make bench-proxy`: it measures, in one run, the
// same load against a local fasthttp upstream directly, through warden's
// ingress, through warden's egress (tenant cap, breaker and pool on), and
// through nginx and HAProxy configured as plain keep-alive reverse
// proxies, then prints throughput and the latency each proxy adds, with
// the ratios warden/nginx and warden/HAProxy.
//
// Every process shares the machine's cores: the upstream, the proxy under
// test and this generator (a fasthttp client with few goroutines). nginx
// runs 2 workers and HAProxy 2 threads, both with keep-alive to the
// upstream, matching warden's GOMAXPROCS on a 2-core machine.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warden-dev/warden/bench/loadgen"
	"github.com/warden-dev/warden/internal/rawio"
)

func main() {
	if len(os.Args) > 2 && os.Args[1] == "upstream" {
		serveUpstream(os.Args[2])
		return
	}
	if len(os.Args) > 3 && os.Args[1] == "floor" {
		mode := ""
		if len(os.Args) > 4 {
			mode = os.Args[4]
		}
		serveFloor(os.Args[2], os.Args[3], mode)
		return
	}
	if len(os.Args) > 3 && os.Args[1] == "relay" {
		serveRelay(os.Args[2], os.Args[3])
		return
	}
	var o options
	flag.StringVar(&o.warden, "warden", "bin/warden", "warden binary")
	flag.StringVar(&o.out, "out", "bench/out", "directory for configs, logs and results")
	flag.IntVar(&o.conc, "c", 32, "connections for the saturation runs")
	flag.DurationVar(&o.dur, "d", 5*time.Second, "measured duration of each run")
	flag.DurationVar(&o.warmup, "warmup", time.Second, "warm-up before each run")
	flag.IntVar(&o.rounds, "rounds", 5, "rounds; the table shows the median")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "benchproxy:", err)
		os.Exit(1)
	}
}

type options struct {
	warden, out  string
	conc, rounds int
	dur, warmup  time.Duration
}

// body is the upstream's answer: a small JSON document, as API calls are.
var body = []byte(`{"id":"ch_42","object":"charge","amount":4200,"currency":"eur","status":"succeeded"}`)

func serveUpstream(addr string) {
	s := &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			ctx.SetContentType("application/json")
			ctx.SetBody(body)
		},
		// It sends a Date, as a server with a clock must (RFC 9110
		// §6.6.1): warden passes one on and adds one only where none
		// came, and nginx replaces it with its own.
		CloseOnShutdown: true,
	}
	if err := s.ListenAndServe(addr); err != nil {
		fmt.Fprintln(os.Stderr, "upstream:", err)
		os.Exit(1)
	}
}

// serveFloor is the least a Go proxy on fasthttp can do: a server whose
// handler passes the request to a HostClient and the response back, with
// no checks, controls or metrics. Its row shows how much of warden's cost
// is the runtime and library floor rather than warden's own work. Modes:
// "raw", its sockets read and write as warden's do (internal/rawio), which
// shows what that alone saves; "pipelined", raw I/O too, and requests
// pipelined over pipelineConns upstream connections by fasthttp's
// PipelineClient, which shows what HTTP/1.1 pipelining to the upstream
// would be worth (warden does not pipeline: proxy/README.md).
func serveFloor(listen, upstream, mode string) {
	raw := mode == "raw" || mode == "pipelined"
	dial := func(addr string) (net.Conn, error) {
		c, err := fasthttp.Dial(addr)
		if err != nil || !raw {
			return c, err
		}
		return rawio.Wrap(c), nil
	}
	var do func(*fasthttp.Request, *fasthttp.Response) error
	if mode == "pipelined" {
		pc := &fasthttp.PipelineClient{Addr: upstream, MaxConns: pipelineConns, MaxPendingRequests: 1024, Dial: dial}
		do = pc.Do
	} else {
		hc := &fasthttp.HostClient{Addr: upstream, MaxIdemponentCallAttempts: 1, Dial: dial}
		do = hc.Do
	}
	s := &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			if err := do(&ctx.Request, &ctx.Response); err != nil {
				ctx.Error(err.Error(), fasthttp.StatusBadGateway)
			}
		},
		NoDefaultServerHeader: true,
		NoDefaultDate:         true,
	}
	ln, err := net.Listen("tcp", listen)
	if err == nil {
		if raw {
			ln = rawio.Listener(ln)
		}
		err = s.Serve(ln)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "floor:", err)
		os.Exit(1)
	}
}

// pipelineConns is the pipelined floor's upstream connections: fewer than
// the generator's, so that requests queue on each and go out in batches.
const pipelineConns = 2

// relayRow names the epoll relay's row (serveRelay).
const relayRow = "epoll relay (TCP)"

// pipelinedRow names the pipelined floor's row (serveFloor).
const pipelinedRow = "floor, pipelined"

// run starts the upstream and every path to it, waits until each serves,
// and measures them.
func run(o options) error {
	out, err := filepath.Abs(o.out)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	self, _ := os.Executable()
	l := &lab{out: out, self: self, ports: freePorts(13)}
	defer l.stop()
	paths, err := l.startPaths(o.warden)
	if err != nil {
		return err
	}
	for _, p := range paths {
		if p.missing != "" {
			continue
		}
		if err := waitServing(p.addr); err != nil {
			return fmt.Errorf("%s on %s: %w", p.name, p.addr, err)
		}
	}
	return measure(o, out, paths)
}

func load(o options, addr string, rate float64) (*loadgen.Result, error) {
	res, err := loadgen.Run(context.Background(), loadgen.Config{
		Addr: addr, Host: "api.bench", Path: "/v1/charges/ch_42",
		Header:      map[string]string{"X-Tenant-Id": "bench"},
		Concurrency: o.conc, Rate: rate, Warmup: o.warmup, Duration: o.dur,
	})
	if err == nil && res.Errors > 0 {
		err = fmt.Errorf("%d errors, first: %s", res.Errors, res.FirstError)
	}
	return res, err
}

// row is one path's figures in one round.
type row struct {
	rps              float64
	cpu              time.Duration // the path's process CPU per request at saturation
	upCPU            time.Duration // the upstream's, in the same run
	idle             time.Duration // the machine's idle CPU per request, in the same run
	rate             float64       // the half-saturation rate of the latency run
	p50, p99, p999   time.Duration // at that rate
	d50, d99, d999   time.Duration // direct, at the same rate, just before
	sat50, sat99     time.Duration // closed-loop latencies at saturation
	measured, failed bool
	err              string
}

func measure(o options, out string, paths []path) error {
	results := make([][]row, len(paths)) // [path][round]
	logf, _ := os.Create(filepath.Join(out, "proxy-rounds.txt"))
	defer logf.Close()
	fmt.Printf("bench-proxy: %d rounds, %d connections, %v per run (+%v warm-up), %d CPUs shared by generator, upstream and proxies\n",
		o.rounds, o.conc, o.dur, o.warmup, runtime.NumCPU())
	fmt.Println("nginx: 2 workers, HTTP/1.1 keep-alive to the upstream (keepalive 128); HAProxy: nbthread 2, keep-alive and http-reuse always;")
	fmt.Println("warden: GOMAXPROCS 2 (rows marked 1P: a second warden with GOMAXPROCS=1); egress with tenant cap, breaker and pool on;")
	fmt.Println("fasthttp floor: a bare fasthttp server + HostClient proxy, no checks or controls (the Go floor);")
	fmt.Println("floor, raw I/O: the same with warden's raw socket reads and writes (internal/rawio);")
	fmt.Printf("floor, pipelined: the same, requests pipelined over %d upstream connections (fasthttp.PipelineClient; warden does not pipeline);\n", pipelineConns)
	fmt.Println("epoll relay: not HTTP; a TCP relay on one epoll loop per thread, as HAProxy's threads wait (the Go ceiling)")
	for round := range o.rounds {
		for i, p := range paths {
			r := row{}
			if p.missing != "" {
				results[i] = append(results[i], r)
				continue
			}
			cpu0, up0, idle0 := cpuTime(p.pid), cpuTime(paths[0].pid), idleTime()
			res, err := load(o, p.addr, 0)
			if err == nil && res.Total > 0 {
				r.cpu = (cpuTime(p.pid) - cpu0) / time.Duration(res.Total)
				r.upCPU = (cpuTime(paths[0].pid) - up0) / time.Duration(res.Total)
				r.idle = (idleTime() - idle0) / time.Duration(res.Total)
			}
			if err != nil {
				r.failed, r.err = true, err.Error()
				results[i] = append(results[i], r)
				fmt.Fprintf(logf, "round %d %s saturation: %v\n", round+1, p.name, err)
				continue
			}
			r.rps, r.measured = res.RPS, true
			r.sat50, r.sat99 = res.Latency.Quantile(0.5), res.Latency.Quantile(0.99)
			fmt.Fprintf(logf, "round %d %-15s saturation %8.0f req/s p50 %v p99 %v cpu/req %v idle/req %v\n", round+1, p.name, r.rps, r.sat50, r.sat99, r.cpu, r.idle)
			results[i] = append(results[i], r)
		}
		// Latency at half of each proxy's own saturation, beside the
		// direct path at the same rate.
		for i, p := range paths {
			r := &results[i][round]
			if i == 0 || !r.measured {
				continue
			}
			r.rate = r.rps / 2
			d, err := load(o, paths[0].addr, r.rate)
			if err != nil {
				r.err = "direct at half rate: " + err.Error()
				continue
			}
			l, err := load(o, p.addr, r.rate)
			if err != nil {
				r.err = "at half rate: " + err.Error()
				continue
			}
			r.d50, r.d99, r.d999 = d.Latency.Quantile(0.5), d.Latency.Quantile(0.99), d.Latency.Quantile(0.999)
			r.p50, r.p99, r.p999 = l.Latency.Quantile(0.5), l.Latency.Quantile(0.99), l.Latency.Quantile(0.999)
			fmt.Fprintf(logf, "round %d %-15s at %8.0f req/s p50 %v p99 %v p99.9 %v | direct p50 %v p99 %v p99.9 %v\n",
				round+1, p.name, r.rate, r.p50, r.p99, r.p999, r.d50, r.d99, r.d999)
		}
		fmt.Printf("round %d of %d done\n", round+1, o.rounds)
	}
	table := render(paths, results)
	fmt.Print(table)
	return os.WriteFile(filepath.Join(out, "proxy.txt"), []byte(table), 0o644)
}

// median of the measured rounds of one path by f.
func median[T int64 | float64 | time.Duration](rows []row, f func(row) T) (T, int) {
	var vs []T
	for _, r := range rows {
		if r.measured && r.err == "" {
			vs = append(vs, f(r))
		}
	}
	if len(vs) == 0 {
		var zero T
		return zero, 0
	}
	slices.Sort(vs)
	return vs[len(vs)/2], len(vs)
}

// paired is the throughput ratio of a to b round by round: the median and
// the range of the rounds where both were measured. The machine's speed
// drifts over minutes (shared hosts), and a round measures every path
// within about a minute, so a ratio within a round cancels most of the
// drift that a ratio of two medians keeps.
func paired(a, b []row) string {
	var rs []float64
	for i := range min(len(a), len(b)) {
		if a[i].measured && b[i].measured && a[i].err == "" && b[i].err == "" && b[i].rps > 0 {
			rs = append(rs, a[i].rps/b[i].rps)
		}
	}
	if len(rs) < 2 {
		return ""
	}
	slices.Sort(rs)
	return fmt.Sprintf("   round by round %.2fx (%.2f-%.2f)", rs[len(rs)/2], rs[0], rs[len(rs)-1])
}

func us(d time.Duration) string { return fmt.Sprintf("%.0fµs", float64(d)/1e3) }

func us1(d time.Duration) string { return fmt.Sprintf("%.1fµs", float64(d)/1e3) }

func render(paths []path, results [][]row) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n%-18s %11s %9s %9s %9s %10s %9s %9s %9s\n", "path", "req/s", "CPU/req", "up CPU", "idle", "rate", "+p50", "+p99", "+p99.9")
	rps := map[string]float64{}
	index := map[string]int{}
	for i, p := range paths {
		index[p.name] = i
	}
	cpu := map[string]time.Duration{}
	added99 := map[string]time.Duration{}
	for i, p := range paths {
		if p.missing != "" {
			fmt.Fprintf(&b, "%-18s %s\n", p.name, "not measured: "+p.missing)
			continue
		}
		sat, n := median(results[i], func(r row) float64 { return r.rps })
		if n == 0 {
			fmt.Fprintf(&b, "%-18s failed: %s\n", p.name, results[i][0].err)
			continue
		}
		rps[p.name] = sat
		c, _ := median(results[i], func(r row) time.Duration { return r.cpu })
		cpu[p.name] = c
		upc, _ := median(results[i], func(r row) time.Duration { return r.upCPU })
		idle, _ := median(results[i], func(r row) time.Duration { return r.idle })
		if i == 0 {
			s50, _ := median(results[i], func(r row) time.Duration { return r.sat50 })
			s99, _ := median(results[i], func(r row) time.Duration { return r.sat99 })
			fmt.Fprintf(&b, "%-18s %11.0f %9s %9s %9s %10s %9s %9s %9s   (upstream alone; at saturation p50 %s p99 %s)\n", p.name, sat, us1(c), us1(upc), us1(idle), "-", "-", "-", "-", us(s50), us(s99))
			continue
		}
		rate, _ := median(results[i], func(r row) float64 { return r.rate })
		a50, _ := median(results[i], func(r row) time.Duration { return r.p50 - r.d50 })
		a99, _ := median(results[i], func(r row) time.Duration { return r.p99 - r.d99 })
		a999, _ := median(results[i], func(r row) time.Duration { return r.p999 - r.d999 })
		added99[p.name] = a99
		fmt.Fprintf(&b, "%-18s %11.0f %9s %9s %9s %10.0f %9s %9s %9s\n", p.name, sat, us1(c), us1(upc), us1(idle), rate, us(a50), us(a99), us(a999))
	}
	b.WriteString("\nreq/s: closed loop at saturation. CPU/req: the proxy process's CPU per request there (for direct, the\n" +
		"upstream's); up CPU: the upstream's in the same runs; idle: the machine's CPU left idle per request\n" +
		"there (both cores; capacity no process used). +pNN: latency added over the direct path\n" +
		"measured at the same rate, half of that path's saturation, open loop. Medians over the rounds;\n" +
		"\"round by round\" is the median (and range) of the throughput ratios taken within each round.\n")
	b.WriteString("\nratios (throughput, higher is better; CPU per request, lower is better; added p99):\n")
	for _, w := range []string{"warden ingress", "warden egress", "warden ingress 1P", "warden egress 1P", "fasthttp floor", "floor, raw I/O", pipelinedRow, relayRow} {
		for _, base := range []string{"nginx", "haproxy"} {
			if rps[w] == 0 || rps[base] == 0 {
				continue
			}
			cpuRatio := "n/a"
			if cpu[base] > 0 {
				cpuRatio = fmt.Sprintf("%.2fx", float64(cpu[w])/float64(cpu[base]))
			}
			fmt.Fprintf(&b, "  %-18s / %-8s throughput %.2fx   CPU/req %s   added p99 %s vs %s%s\n", w, base, rps[w]/rps[base], cpuRatio, us(added99[w]), us(added99[base]),
				paired(results[index[w]], results[index[base]]))
		}
	}
	if f, r := cpu["fasthttp floor"], cpu["floor, raw I/O"]; f > 0 && r > 0 {
		fmt.Fprintf(&b, "  %-18s / fasthttp floor CPU/req %.2fx, throughput %.2fx (what raw socket I/O saves)\n", "floor, raw I/O", float64(r)/float64(f), rps["floor, raw I/O"]/rps["fasthttp floor"])
		for _, w := range []string{"warden ingress", "warden egress"} {
			if cpu[w] > 0 {
				fmt.Fprintf(&b, "  %-18s / floor, raw I/O CPU/req %.2fx (warden's own work: %s per request)\n", w, float64(cpu[w])/float64(r), us1(cpu[w]-r))
			}
		}
	}
	b.WriteString("\ngoals (warden as shipped, GOMAXPROCS=2): throughput >= 1.0x haproxy and >= 1.3x nginx; added p99 <= 200µs at half of saturation\n")
	for _, w := range []string{"warden ingress", "warden egress"} {
		if rps[w] == 0 {
			continue
		}
		check := func(ok bool) string {
			if ok {
				return "met"
			}
			return "NOT met"
		}
		line := fmt.Sprintf("  %-18s", w)
		if rps["haproxy"] > 0 {
			line += fmt.Sprintf("  vs haproxy %s", check(rps[w] >= rps["haproxy"]))
		}
		if rps["nginx"] > 0 {
			line += fmt.Sprintf("  vs 1.3x nginx %s", check(rps[w] >= 1.3*rps["nginx"]))
		}
		line += fmt.Sprintf("  added p99 %s", check(added99[w] <= 200*time.Microsecond))
		b.WriteString(line + "\n")
	}
	return b.String()
}
