// Command chaos is `make chaos`: it drives the built warden binary from
// outside, with real clients, a real Redis and a real Postgres of its own,
// through faults and hostile load, and checks after each scenario the
// invariants warden promises (SPEC §12, issue 30). It prints one table
// (also written to OUT/chaos.txt) and exits 1 when any invariant failed,
// naming it.
//
//	chaos -warden bin/warden -out bench/out           # the full run
//	chaos -short                                      # CI's few minutes
//	chaos -run 'redis|breaker'                        # some scenarios
//	chaos -list
//
// Every scenario is bounded in time, stops the processes it started by
// their PIDs and removes its temporary directory. Logs of the processes it
// ran stay in OUT/chaos-logs.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "rlimit-exec":
			if err := rlimitExec(os.Args[2:]); err != nil {
				fmt.Fprintln(os.Stderr, "chaos:", err)
				os.Exit(2)
			}
			return
		case "flood":
			if err := floodMain(os.Args[2:]); err != nil {
				fmt.Fprintln(os.Stderr, "chaos flood:", err)
				os.Exit(2)
			}
			return
		}
	}
	var (
		bin, out, only string
		short, list    bool
		soak           time.Duration
	)
	flag.StringVar(&bin, "warden", "bin/warden", "the warden binary (make build)")
	flag.StringVar(&out, "out", "bench/out", "where chaos.txt and chaos-logs/ go")
	flag.StringVar(&only, "run", "", "run only the scenarios whose name matches this regular expression")
	flag.BoolVar(&short, "short", false, "the short mode CI runs (a few minutes in all)")
	flag.BoolVar(&list, "list", false, "list the scenarios and exit")
	flag.DurationVar(&soak, "soak", 0, "the soak's length (default 10m, 1m with -short)")
	flag.Parse()
	if list {
		for _, d := range scenarios {
			fmt.Printf("%-18s %s\n", d.name, d.about)
		}
		return
	}
	ok, err := run(bin, out, only, short, soak)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}

// env is what every scenario shares: the binaries, the output directory,
// the mode, the children still running, and the private Postgres (started
// by the first scenario that needs it, stopped at the end).
type env struct {
	warden string
	self   string
	out    string
	logDir string
	short  bool
	soak   time.Duration
	procs  procs // each scenario's children, swept after it
	shared procs // children that serve several scenarios (Postgres)
	pg     *postgres
}

func run(bin, out, only string, short bool, soak time.Duration) (bool, error) {
	var match *regexp.Regexp
	if only != "" {
		var err error
		if match, err = regexp.Compile(only); err != nil {
			return false, fmt.Errorf("-run: %w", err)
		}
	}
	e := &env{short: short, soak: soak}
	var err error
	if e.warden, err = filepath.Abs(bin); err != nil {
		return false, err
	}
	if _, err := os.Stat(e.warden); err != nil {
		return false, fmt.Errorf("warden binary: %w (make build)", err)
	}
	if e.self, err = os.Executable(); err != nil {
		return false, err
	}
	if e.out, err = filepath.Abs(out); err != nil {
		return false, err
	}
	e.logDir = filepath.Join(e.out, "chaos-logs")
	if err := os.MkdirAll(e.logDir, 0o755); err != nil {
		return false, err
	}
	if e.soak == 0 {
		e.soak = 10 * time.Minute
		if short {
			e.soak = time.Minute
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	defer e.stopPostgres()

	mode := "full"
	if short {
		mode = "short"
	}
	fmt.Printf("chaos (%s mode): %s, logs in %s\n", mode, e.warden, e.logDir)
	var rows []*row
	for _, d := range scenarios {
		if match != nil && !match.MatchString(d.name) {
			continue
		}
		if ctx.Err() != nil {
			break
		}
		fmt.Printf("== %s: %s\n", d.name, d.about)
		start := time.Now()
		r := e.runScenario(ctx, d)
		fmt.Printf("   %s in %v\n", r.verdict(), time.Since(start).Round(100*time.Millisecond))
		rows = append(rows, r)
	}
	if len(rows) == 0 {
		return false, fmt.Errorf("no scenario matches -run %q", only)
	}
	table := render(rows, mode)
	fmt.Print("\n" + table)
	if err := os.WriteFile(filepath.Join(e.out, "chaos.txt"), []byte(table), 0o644); err != nil {
		return false, err
	}
	if ctx.Err() != nil {
		return false, fmt.Errorf("interrupted")
	}
	for _, r := range rows {
		if !r.passed() {
			return false, nil
		}
	}
	return true, nil
}

// scenario is one scenario's run: its row, its temporary directory and its
// environment.
type scenario struct {
	env      *env
	name     string
	dir      string
	row      *row
	smp      *sampler
	cleanups []func()
}

// definition is a scenario as listed: a name for -run, what it does, how
// long it may take at most (short and full mode), and its body, which
// fills the row and returns an error only when it could not set up.
type definition struct {
	name        string
	about       string
	short, full time.Duration
	run         func(ctx context.Context, s *scenario) error
}

func (e *env) runScenario(ctx context.Context, d definition) (r *row) {
	r = newRow(d.name)
	limit := d.full
	if e.short {
		limit = d.short
	}
	if d.name == "soak" {
		limit += e.soak
	}
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	dir, err := os.MkdirTemp("", "warden-chaos-"+d.name+"-")
	if err != nil {
		r.setup = err
		return r
	}
	s := &scenario{env: e, name: d.name, dir: dir, row: r}
	// This run's logs replace the last run's.
	if old, err := filepath.Glob(filepath.Join(e.logDir, d.name+"-*.log")); err == nil {
		for _, f := range old {
			os.Remove(f)
		}
	}
	defer func() {
		if p := recover(); p != nil {
			r.setup = fmt.Errorf("panic: %v", p)
		}
		if s.smp != nil {
			s.smp.stop()
		}
		for i := len(s.cleanups) - 1; i >= 0; i-- {
			s.cleanups[i]()
		}
		if left := e.procs.sweep(10 * time.Second); len(left) > 0 {
			r.note("stopped at the end: %v", left)
		}
		if err := os.RemoveAll(dir); err != nil {
			r.note("temp dir: %v", err)
		}
	}()
	if err := d.run(ctx, s); err != nil {
		r.setup = err
	}
	if ctx.Err() != nil && r.setup == nil && len(r.checks) == 0 {
		r.setup = fmt.Errorf("ran out of its %v", limit)
	}
	return r
}

// watch starts sampling warden's resources and takes the "before" reading.
func (s *scenario) watch(ctx context.Context, w *warden) {
	s.smp = startSampler(ctx, w)
	s.smp.scrape(ctx)
	s.row.before = s.smp.take()
}

// settle takes the "after" reading and the peak over the whole scenario.
func (s *scenario) settle() {
	if s.smp == nil {
		return
	}
	s.smp.scrape(context.Background())
	s.row.after = s.smp.take()
	s.row.peak = peak(s.smp.all())
	s.row.sampled = true
}

// sleep waits d or until ctx ends; false when ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// pick is the short mode's value or the full run's.
func (s *scenario) pick(short, full int) int {
	if s.env.short {
		return short
	}
	return full
}

func (s *scenario) pickDur(short, full time.Duration) time.Duration {
	if s.env.short {
		return short
	}
	return full
}
