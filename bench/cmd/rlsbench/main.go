// Command rlsbench is `make bench-rls`: shared-window admissions through
// Redis from one and from three processes, and Envoy RateLimitService calls
// with memory and with Redis windows, each beside the same run's
// `redis-benchmark -t incr` figure (what this Redis serves one command per
// round trip) and a per-decision baseline. It prints one table per round.
//
// The work runs in child processes of this binary (-child ...), as sidecars
// would: the parent only starts them, generates RLS load and prints.
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/warden-dev/warden/governor"
	"github.com/warden-dev/warden/governor/backend/redisx"
	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/metrics"
	"github.com/warden-dev/warden/governor/window"
	"github.com/warden-dev/warden/internal/gcfloor"
	"github.com/warden-dev/warden/policy"
	"github.com/warden-dev/warden/proxy/rls"
)

type options struct {
	url        string
	duration   time.Duration
	callers    int // concurrent admissions per process
	rlsCallers int
	rlsConns   int
	rounds     int
	keys       int
	child      string
	prefix     string
	backend    string
	profile    string
	senders    int
	only       string
	// envoyproxy/ratelimit's server binary and extra settings for it
	ratelimit    string
	ratelimitEnv string
}

func main() {
	var o options
	flag.StringVar(&o.url, "redis", "redis://127.0.0.1:6379/0", "Redis URL")
	flag.DurationVar(&o.duration, "duration", 5*time.Second, "measured time per row")
	flag.IntVar(&o.callers, "callers", 64, "concurrent admissions per process (in flight at once, as requests in a sidecar)")
	flag.IntVar(&o.rlsCallers, "rls-callers", 64, "concurrent ShouldRateLimit callers")
	flag.IntVar(&o.rlsConns, "rls-conns", 4, "gRPC connections the callers share")
	flag.IntVar(&o.rounds, "rounds", 3, "repeat the whole table this many times (ratios are their median)")
	flag.IntVar(&o.keys, "keys", 1000, "distinct tenants the load spreads over")
	flag.StringVar(&o.child, "child", "", "internal: admit | baseline | rls")
	flag.StringVar(&o.prefix, "prefix", "", "internal: Redis key prefix")
	flag.StringVar(&o.backend, "backend", "redis", "internal: memory | redis (rls child)")
	flag.StringVar(&o.only, "only", "", "run only the admission rows (admit) or the RLS rows (rls)")
	flag.IntVar(&o.senders, "senders", 0, "Redis batch senders per process (0: redisx default)")
	flag.StringVar(&o.ratelimit, "ratelimit", "", "envoyproxy/ratelimit's server binary (src/service_cmd) for the baseline rows")
	flag.StringVar(&o.ratelimitEnv, "ratelimit-env", "", "extra settings for it, e.g. REDIS_POOL_SIZE=64,GOMAXPROCS=2")
	flag.StringVar(&o.profile, "rls-cpuprofile", "", "write the RLS server's CPU profile to FILE.memory / FILE.redis")
	flag.Parse()
	log.SetFlags(0)
	if o.child != "baseline" {
		// The admit and rls children stand in for `warden run`: the same GC
		// setting. The parent is the RLS load generator, standing in for
		// Envoy's C++ client: its collections should not take the shared
		// cores from the server it measures. The baseline stands in for
		// envoyproxy/ratelimit, a Go service run with the default GOGC.
		defer gcfloor.Start(gcfloor.Default).Stop()
	}
	switch o.child {
	case "admit":
		report(runAdmit(o))
	case "baseline":
		report(runBaseline(o))
	case "rls":
		serveRLS(o)
	case "":
		parent(o)
	default:
		log.Fatalf("unknown -child %q", o.child)
	}
}

// result is one load's outcome, printed by children as a JSON line. Ops
// counts successful decisions only; latencies are theirs.
type result struct {
	Ops     int64   `json:"ops"`
	Seconds float64 `json:"seconds"`
	P50     float64 `json:"p50_ms"`
	P99     float64 `json:"p99_ms"`
	Errors  int64   `json:"errors"`
	// CPU is the CPU time (user+system) the deciding process used while
	// measured, so CPU per decision can be read even on a busy machine.
	CPU float64 `json:"cpu_seconds"`
	// RedisCPU is Redis's CPU time over the same span (RLS rows; 0: not read).
	RedisCPU float64 `json:"redis_cpu_seconds,omitempty"`
}

// cpuSeconds is this process's CPU time so far.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

func (r result) rate() float64 { return float64(r.Ops) / r.Seconds }

func report(r result) {
	if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
		log.Fatal(err)
	}
}

// load runs f from n goroutines for warm-up plus d, measuring only d.
// cpu, when not nil, is read at the start and end of the measured span.
func load(n int, d time.Duration, cpu func() float64, f func(worker, i int) error) result {
	const warmup = 500 * time.Millisecond
	lat := make([][]time.Duration, n)
	errs := make([]int64, n)
	var wg sync.WaitGroup
	begin := time.Now()
	measureFrom, end := begin.Add(warmup), begin.Add(warmup+d)
	var cpu0, cpu1 float64
	if cpu != nil {
		t := time.AfterFunc(warmup, func() { cpu0 = cpu() })
		defer t.Stop()
	}
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := make([]time.Duration, 0, 1<<14)
			for i := 0; ; i++ {
				t0 := time.Now()
				if t0.After(end) {
					break
				}
				err := f(w, i)
				if t0.After(measureFrom) {
					if err != nil {
						errs[w]++
						continue
					}
					l = append(l, time.Since(t0))
				}
			}
			lat[w] = l
		}()
	}
	wg.Wait()
	if cpu != nil {
		cpu1 = cpu()
	}
	var all []time.Duration
	r := result{CPU: cpu1 - cpu0}
	for w := range n {
		all = append(all, lat[w]...)
		r.Errors += errs[w]
	}
	slices.Sort(all)
	r.Ops, r.Seconds = int64(len(all)), d.Seconds()
	if len(all) > 0 {
		r.P50 = float64(all[len(all)/2]) / 1e6
		r.P99 = float64(all[len(all)*99/100]) / 1e6
	}
	return r
}

func tenants(n int) [][]byte {
	k := make([][]byte, n)
	for i := range k {
		k[i] = []byte("tenant-" + strconv.Itoa(i))
	}
	return k
}

// runAdmit is one sidecar's shared admissions: Counter.Take through Redis
// under many concurrent callers, every one admitted (the limit is out of
// reach, so no refusal is answered from the local cache).
func runAdmit(o options) result {
	r, err := window.NewRedis(benchRedis(o), clock.Real{}, nil, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()
	s := window.NewScope("tenant:ingress", 3600)
	keys := tenants(o.keys)
	return load(o.callers, o.duration, cpuSeconds, func(w, i int) error {
		if d := r.Take(s, keys[(w*7919+i)%len(keys)], 1<<40, 1, time.Now()); !d.Allowed {
			return fmt.Errorf("refused")
		}
		return nil
	})
}

// benchRedis is fail_closed, so that a decision the backend did not make
// (an outage, a timeout) shows as an error rather than as a fast local one.
func benchRedis(o options) window.RedisConfig {
	return window.RedisConfig{Config: redisx.Config{URL: o.url, FailClosed: true, Senders: o.senders}, Prefix: o.prefix}
}

// runBaseline is what envoyproxy/ratelimit does per decision: one
// round trip carrying INCRBY and EXPIRE in a pipeline, no batching across
// callers, with the same concurrency.
func runBaseline(o options) result {
	opt, err := redis.ParseURL(o.url)
	if err != nil {
		log.Fatal(err)
	}
	opt.PoolSize = o.callers
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	keys := make([]string, o.keys)
	for i := range keys {
		keys[i] = o.prefix + "baseline:" + strconv.Itoa(i)
	}
	ctx := context.Background()
	return load(o.callers, o.duration, cpuSeconds, func(w, i int) error {
		k := keys[(w*7919+i)%len(keys)]
		_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.IncrBy(ctx, k, 1)
			p.Expire(ctx, k, time.Hour)
			return nil
		})
		return err
	})
}

const rlsPolicy = `version: 1
rls:
  listen: 127.0.0.1:0
  domains:
    bench:
      - { key: tenant, rate: 2000000000, window: 3600 }
`

// serveRLS runs an RLS until stdin closes, printing its address first.
func serveRLS(o options) {
	p, err := policy.Parse("bench.yaml", []byte(rlsPolicy))
	if err != nil {
		log.Fatal(err)
	}
	clk := clock.Real{}
	m := metrics.New()
	var counter window.Counter = window.NewMemory(clk)
	if o.backend == "redis" {
		r, err := window.NewRedis(benchRedis(o), clk, m, nil)
		if err != nil {
			log.Fatal(err)
		}
		defer r.Close()
		counter = r
	}
	srv := rls.New(counter, clk, m, nil)
	if err := srv.Apply(context.Background(), governor.New(clk, m, counter).Apply(p)); err != nil {
		log.Fatal(err)
	}
	if o.profile != "" {
		f, err := os.Create(o.profile + "." + o.backend)
		if err != nil {
			log.Fatal(err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	fmt.Println("ADDR", srv.Addr())
	// Each line on stdin asks for this process's CPU time; EOF stops it.
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		fmt.Printf("CPU %g\n", cpuSeconds())
	}
	_ = srv.Shutdown(context.Background())
}

// rlsLoad drives an RLS at addr with callers over conns connections, using
// grpc-go's client or the lean HTTP/2 one (h2load.go); cpu reads the
// server's CPU time.
func rlsLoad(o options, addr, client string, cpu func() float64) result {
	reqs := make([]*rlspb.RateLimitRequest, o.keys)
	wire := make([][]byte, o.keys)
	for i := range reqs {
		reqs[i] = &rlspb.RateLimitRequest{Domain: "bench", Descriptors: []*commonpb.RateLimitDescriptor{
			{Entries: []*commonpb.RateLimitDescriptor_Entry{{Key: "tenant", Value: "tenant-" + strconv.Itoa(i)}}},
		}}
		b, err := proto.Marshal(reqs[i])
		if err != nil {
			log.Fatal(err)
		}
		wire[i] = b
	}
	if client == "h2" {
		var conns []*h2client
		for range o.rlsConns {
			c, err := dialH2(addr)
			if err != nil {
				log.Fatal(err)
			}
			defer c.close()
			conns = append(conns, c)
		}
		return load(o.rlsCallers, o.duration, cpu, func(w, i int) error {
			return conns[w%len(conns)].call(wire[(w*7919+i)%len(wire)])
		})
	}
	var clients []rlspb.RateLimitServiceClient
	for range o.rlsConns {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			log.Fatal(err)
		}
		defer conn.Close()
		clients = append(clients, rlspb.NewRateLimitServiceClient(conn))
	}
	ctx := context.Background()
	return load(o.rlsCallers, o.duration, cpu, func(w, i int) error {
		resp, err := clients[w%len(clients)].ShouldRateLimit(ctx, reqs[(w*7919+i)%len(reqs)])
		if err == nil && resp.OverallCode != rlspb.RateLimitResponse_OK {
			err = fmt.Errorf("refused")
		}
		return err
	})
}

// child starts this binary with -child args.
func child(o options, args ...string) *exec.Cmd {
	self, err := os.Executable()
	if err != nil {
		log.Fatal(err)
	}
	base := []string{"-redis", o.url, "-duration", o.duration.String(), "-callers", strconv.Itoa(o.callers),
		"-keys", strconv.Itoa(o.keys), "-prefix", o.prefix, "-senders", strconv.Itoa(o.senders)}
	cmd := exec.Command(self, append(base, args...)...)
	cmd.Stderr = os.Stderr
	return cmd
}

// children runs n children of one kind at once and returns their results.
func children(o options, n int, kind string) []result {
	out := make([]result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, err := child(o, "-child", kind).Output()
			if err != nil {
				log.Fatalf("child %s: %v", kind, err)
			}
			if err := json.Unmarshal(b, &out[i]); err != nil {
				log.Fatalf("child %s printed %q: %v", kind, b, err)
			}
		}()
	}
	wg.Wait()
	return out
}

// withRLS starts an RLS child on backend and runs the load against it.
func withRLS(o options, backend, client string) result {
	cmd := child(o, "-child", "rls", "-backend", backend, "-rls-cpuprofile", o.profile)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		log.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		log.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		log.Fatal(err)
	}
	out := bufio.NewReader(stdout)
	line, err := out.ReadString('\n')
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "ADDR ")
	if err != nil || !ok {
		_ = cmd.Process.Kill()
		log.Fatalf("rls child printed %q: %v", line, err)
	}
	var mu sync.Mutex
	cpu := func() float64 {
		mu.Lock()
		defer mu.Unlock()
		if _, err := io.WriteString(stdin, "cpu\n"); err != nil {
			return 0
		}
		line, _ := out.ReadString('\n')
		v, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimPrefix(line, "CPU ")), 64)
		return v
	}
	r := measureRLS(o, addr, client, cpu)
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		log.Printf("rls child: %v", err)
	}
	return r
}

var incrLine = regexp.MustCompile(`INCR: ([\d.]+) requests per second`)

// ceiling is `redis-benchmark -t incr -q` against the same server.
func ceiling(o options) (float64, error) {
	u, err := url.Parse(o.url)
	if err != nil {
		return 0, err
	}
	args := []string{"-t", "incr", "-q", "-n", "200000", "-h", u.Hostname()}
	if p := u.Port(); p != "" {
		args = append(args, "-p", p)
	}
	out, err := exec.Command("redis-benchmark", args...).Output()
	if err != nil {
		return 0, fmt.Errorf("redis-benchmark (apt-get install redis-tools): %w", err)
	}
	// -q rewrites a progress line with \r; the summary is the last match.
	m := incrLine.FindAllStringSubmatch(string(out), -1)
	if m == nil {
		return 0, fmt.Errorf("redis-benchmark printed no INCR figure: %q", out)
	}
	return strconv.ParseFloat(m[len(m)-1][1], 64)
}

func parent(o options) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	o.prefix = "wardenbench:" + hex.EncodeToString(b[:]) + ":"
	defer cleanup(o)
	if o.ratelimit != "" {
		_ = os.Remove(ratelimitLog(o)) // this run's server output only
	}
	fmt.Printf("bench-rls: %s, %s measured per row after 0.5s warm-up, %d callers per admitting process, %d RLS callers over %d connections, %d tenants; %d cores\n",
		o.url, o.duration, o.callers, o.rlsCallers, o.rlsConns, o.keys, runtime.NumCPU())
	if o.only != "admit" {
		fmt.Printf("baseline RLS: %s (%s)\n", ratelimitVersion(o.ratelimit), o.ratelimit)
	}
	fmt.Println()
	failed := false
	var all []comparison
	for round := 1; round <= o.rounds; round++ {
		ceil, err := ceiling(o)
		if err != nil {
			log.Fatal(err)
		}
		var rows []row
		var cmp []comparison
		if o.only != "rls" {
			rows = admitRows(o)
		}
		if o.only != "admit" {
			var r []row
			r, cmp = rlsRows(o)
			rows = append(rows, r...)
		}
		failed = printRound(round, ceil, rows) || failed
		printComparisons(cmp)
		all = append(all, cmp...)
	}
	printMedians(all, o.rounds)
	printFooter()
	if failed {
		os.Exit(1)
	}
}

func cleanup(o options) {
	opt, err := redis.ParseURL(o.url)
	if err != nil {
		return
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	ctx := context.Background()
	iter := rdb.Scan(ctx, 0, o.prefix+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
		if len(keys) == 1000 {
			rdb.Del(ctx, keys...)
			keys = keys[:0]
		}
	}
	if len(keys) > 0 {
		rdb.Del(ctx, keys...)
	}
}
