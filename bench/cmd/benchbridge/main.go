// Command benchbridge is `make bench-bridge`: pgbench against one Postgres
// three ways in the same run — directly, through a warden bridge (the built
// binary, with a generated policy), and through PgBouncer in session mode
// with the same pool size — and a table of TPS, average latency and the
// ratios warden/direct and warden/PgBouncer.
//
// Workloads: `pgbench -S -j 2` with 16 clients (pool size 16, so nobody
// waits), 64 clients (48 wait in the queue all run long: session mode), and
// 64 clients reconnecting for every transaction (-C: the queue and the
// connection path at full churn). Each runs BENCH_RUNS rounds (median
// reported), paths in rotating order so that drift on a shared machine
// spreads evenly.
//
// Beside throughput it reports the CPU time the proxy process (warden or
// PgBouncer) spent per transaction: on a machine shared with other work,
// TPS swings from run to run, while the cost of the proxy itself is a
// steadier measure of its efficiency.
//
// Environment: BENCH_T seconds per pgbench run (default 20), BENCH_RUNS
// (default 3), BENCH_PG (default postgres://postgres@127.0.0.1:5432/postgres
// for the admin connection; the benchmark database is wardenbench).
package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

const (
	poolSize   = 16
	wardenPort = 16432
	bouncePort = 16433
	adminPort  = 19901
	benchDB    = "wardenbench"
	outDir     = "bench/out"
)

type workload struct {
	label   string
	clients int
	connect bool // -C
	// goals: minimum warden/direct and warden/pgbouncer ratios (0: none)
	minDirect, minBouncer float64
}

var workloads = []workload{
	{"-c 16", 16, false, 0.9, 1.0},
	{"-c 64", 64, false, 0, 1.0},
	{"-c 64 -C", 64, true, 0, 0},
}

type path struct {
	name string
	port int
	pid  int // the proxy process, whose CPU time is measured (0: none)
}

type result struct {
	tps, latencyMS float64
	cpuPerTxnUS    float64 // proxy CPU time per transaction (0: not measured)
	err            error
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench-bridge:", err)
		os.Exit(1)
	}
}

func run() error {
	secs := envInt("BENCH_T", 20)
	rounds := envInt("BENCH_RUNS", 3)
	admin := os.Getenv("BENCH_PG")
	if admin == "" {
		admin = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	}
	for _, tool := range []string{"pgbench", "pgbouncer"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not found: apt-get install -y postgresql-client pgbouncer", tool)
		}
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(admin)
	if err != nil {
		return fmt.Errorf("BENCH_PG: %w", err)
	}
	pgAddr := net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
	if err := prepare(ctx, admin, cfg); err != nil {
		return err
	}

	warden, err := startWarden(pgAddr)
	if err != nil {
		return err
	}
	defer stop("warden", warden)
	bouncer, err := startPgBouncer(cfg)
	if err != nil {
		return err
	}
	defer stop("pgbouncer", bouncer)

	paths := []path{{"direct", int(cfg.Port), 0}, {"pgbouncer", bouncePort, bouncer.Process.Pid}, {"warden", wardenPort, warden.Process.Pid}}
	results := map[string]map[string][]result{} // workload -> path -> rounds
	fmt.Printf("pgbench -S -j 2 -T %d on %s, scale 10; pool size %d; %d round(s), median\n\n", secs, pgAddr, poolSize, rounds)
	for _, w := range workloads {
		results[w.label] = map[string][]result{}
		for r := range rounds {
			for i := range paths {
				p := paths[(i+r)%len(paths)]
				res := pgbench(cfg.User, p, w, secs)
				results[w.label][p.name] = append(results[w.label][p.name], res)
				status := fmt.Sprintf("%9.0f tps %7.3f ms", res.tps, res.latencyMS)
				if res.cpuPerTxnUS > 0 {
					status += fmt.Sprintf(" %6.1f µs CPU/txn", res.cpuPerTxnUS)
				}
				if res.err != nil {
					status = "failed: " + res.err.Error()
				}
				fmt.Printf("  %-9s round %d  %-9s %s\n", w.label, r+1, p.name, status)
			}
		}
	}
	fmt.Println()
	printTable(results)
	if snap, err := bridgeSnapshot(); err == nil {
		fmt.Printf("\nwarden /v1/bridges after the runs:\n%s\n", snap)
	}
	return nil
}

// prepare creates and initialises the benchmark database.
func prepare(ctx context.Context, admin string, cfg *pgx.ConnConfig) error {
	c, err := pgx.Connect(ctx, admin)
	if err != nil {
		return fmt.Errorf("connect to Postgres: %w", err)
	}
	var exists bool
	err = c.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", benchDB).Scan(&exists)
	if err == nil && !exists {
		_, err = c.Exec(ctx, "CREATE DATABASE "+benchDB)
	}
	c.Close(ctx)
	if err != nil {
		return fmt.Errorf("create database %s: %w", benchDB, err)
	}
	cmd := exec.Command("pgbench", "-i", "-s", "10", "-q", "-h", cfg.Host, "-p", strconv.Itoa(int(cfg.Port)), "-U", cfg.User, benchDB)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pgbench -i: %v\n%s", err, out)
	}
	return nil
}

func startWarden(pgAddr string) (*exec.Cmd, error) {
	bin := filepath.Join(outDir, "warden")
	build := exec.Command("go", "build", "-o", bin, "./cmd/warden")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return nil, fmt.Errorf("build warden: %w", err)
	}
	pol := filepath.Join(outDir, "bridge-bench.yaml")
	policy := fmt.Sprintf(`version: 1
admin: { listen: 127.0.0.1:%d }
bridges:
  - name: bench
    listen: 127.0.0.1:%d
    upstream: %s
    protocol: postgres
    max_connections: %d
    wait_timeout: 120s
`, adminPort, wardenPort, pgAddr, poolSize)
	if err := os.WriteFile(pol, []byte(policy), 0o644); err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(outDir, "warden-bench.log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "run", "--policy", pol, "--data-dir", filepath.Join(outDir, "warden-data"))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	if err := waitPort(wardenPort); err != nil {
		stop("warden", cmd)
		return nil, fmt.Errorf("warden did not listen (see %s): %w", logf.Name(), err)
	}
	return cmd, nil
}

// startPgBouncer runs PgBouncer in session mode with the same pool size. It
// refuses to run as root, so as root it runs as the postgres user.
func startPgBouncer(cfg *pgx.ConnConfig) (*exec.Cmd, error) {
	dir, err := filepath.Abs(filepath.Join(outDir, "pgbouncer"))
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%d

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s/userlist.txt
pool_mode = session
default_pool_size = %d
max_client_conn = 1000
query_wait_timeout = 120
`, cfg.Host, cfg.Port, bouncePort, dir, poolSize)
	files := map[string]string{"pgbouncer.ini": ini, "userlist.txt": fmt.Sprintf("%q \"\"\n", cfg.User)}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			return nil, err
		}
	}
	cmd := exec.Command("pgbouncer", filepath.Join(dir, "pgbouncer.ini"))
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("pgbouncer refuses root and there is no postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		for _, f := range []string{dir, filepath.Join(dir, "pgbouncer.ini"), filepath.Join(dir, "userlist.txt")} {
			if err := os.Chown(f, uid, gid); err != nil {
				return nil, err
			}
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	}
	logf, err := os.Create(filepath.Join(outDir, "pgbouncer-bench.log"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start pgbouncer: %w", err)
	}
	if err := waitPort(bouncePort); err != nil {
		stop("pgbouncer", cmd)
		return nil, fmt.Errorf("pgbouncer did not listen (see %s): %w", logf.Name(), err)
	}
	return cmd, nil
}

func waitPort(port int) error {
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("nothing on port %d", port)
}

// stop ends a process by its PID: SIGTERM, then SIGKILL after 10s.
func stop(name string, cmd *exec.Cmd) {
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		fmt.Fprintf(os.Stderr, "%s (pid %d) ignored SIGTERM; killing\n", name, cmd.Process.Pid)
		_ = cmd.Process.Kill()
		<-done
	}
}

var (
	tpsLine = regexp.MustCompile(`(?m)^tps = ([\d.]+)`)
	latLine = regexp.MustCompile(`(?m)^latency average = ([\d.]+) ms`)
	failed  = regexp.MustCompile(`(?m)^number of failed transactions: (\d+)`)
	txnLine = regexp.MustCompile(`(?m)^number of transactions actually processed: (\d+)`)
)

// cpuSeconds is the CPU time (user + system, all threads) process pid has
// used, from /proc/PID/stat, whose times are in USER_HZ (100 per second on
// Linux).
func cpuSeconds(pid int) (float64, error) {
	if pid == 0 {
		return 0, errors.New("no process")
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; fields count from its ')'.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}
	ut, err1 := strconv.ParseFloat(f[11], 64)
	st, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return 0, errors.New("bad /proc stat")
	}
	return (ut + st) / 100, nil
}

func pgbench(userName string, p path, w workload, secs int) result {
	args := []string{"-S", "-j", "2", "-c", strconv.Itoa(w.clients), "-T", strconv.Itoa(secs),
		"-h", "127.0.0.1", "-p", strconv.Itoa(p.port), "-U", userName, "-n"}
	if w.connect {
		args = append(args, "-C")
	}
	cpu0, cpuErr := cpuSeconds(p.pid)
	out, err := exec.Command("pgbench", append(args, benchDB)...).CombinedOutput()
	cpu1, cpuErr1 := cpuSeconds(p.pid)
	text := string(out)
	var r result
	if m := tpsLine.FindStringSubmatch(text); m != nil {
		r.tps, _ = strconv.ParseFloat(m[1], 64)
	}
	if m := latLine.FindStringSubmatch(text); m != nil {
		r.latencyMS, _ = strconv.ParseFloat(m[1], 64)
	}
	if m := txnLine.FindStringSubmatch(text); m != nil && p.pid != 0 && cpuErr == nil && cpuErr1 == nil {
		if n, _ := strconv.ParseFloat(m[1], 64); n > 0 {
			r.cpuPerTxnUS = (cpu1 - cpu0) / n * 1e6
		}
	}
	switch m := failed.FindStringSubmatch(text); {
	case err != nil:
		r.err = fmt.Errorf("%v: %s", err, lastLine(text))
	case m != nil && m[1] != "0":
		r.err = fmt.Errorf("%s failed transactions", m[1])
	case r.tps == 0:
		r.err = errors.New("no tps in pgbench output: " + lastLine(text))
	}
	return r
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// median of the successful rounds; ok false if none succeeded.
func median(rs []result) (result, bool) {
	var good []result
	for _, r := range rs {
		if r.err == nil {
			good = append(good, r)
		}
	}
	if len(good) == 0 {
		return result{}, false
	}
	slices.SortFunc(good, func(a, b result) int { return cmp.Compare(a.tps, b.tps) })
	return good[len(good)/2], true
}

func printTable(results map[string]map[string][]result) {
	fmt.Printf("%-10s %20s %20s %20s %14s %17s %22s  %s\n", "workload", "direct tps (ms)", "pgbouncer tps (ms)", "warden tps (ms)",
		"warden/direct", "warden/pgbouncer", "CPU µs/txn pgb:warden", "goals")
	cell := func(r result, ok bool) string {
		if !ok {
			return "failed"
		}
		return fmt.Sprintf("%.0f (%.3f)", r.tps, r.latencyMS)
	}
	for _, w := range workloads {
		d, okD := median(results[w.label]["direct"])
		p, okP := median(results[w.label]["pgbouncer"])
		wd, okW := median(results[w.label]["warden"])
		ratio := func(a, b result, okA, okB bool) (string, float64) {
			if !okA || !okB || b.tps == 0 {
				return "-", 0
			}
			return fmt.Sprintf("%.2f", a.tps/b.tps), a.tps / b.tps
		}
		rd, vd := ratio(wd, d, okW, okD)
		rp, vp := ratio(wd, p, okW, okP)
		var goals []string
		if w.minDirect > 0 {
			goals = append(goals, verdict(fmt.Sprintf("≥%.2f direct", w.minDirect), vd >= w.minDirect))
		}
		if w.minBouncer > 0 {
			goals = append(goals, verdict(fmt.Sprintf("≥%.2f pgbouncer", w.minBouncer), vp >= w.minBouncer))
		}
		if len(goals) == 0 {
			goals = append(goals, "none (informational)")
		}
		cpu := "-"
		if cp, cw := medianCPU(results[w.label]["pgbouncer"]), medianCPU(results[w.label]["warden"]); cp > 0 && cw > 0 {
			cpu = fmt.Sprintf("%.1f : %.1f", cp, cw)
		}
		fmt.Printf("%-10s %20s %20s %20s %14s %17s %22s  %s\n", w.label, cell(d, okD), cell(p, okP), cell(wd, okW), rd, rp, cpu, strings.Join(goals, ", "))
	}
}

// medianCPU is the median proxy CPU per transaction of the successful rounds.
func medianCPU(rs []result) float64 {
	var v []float64
	for _, r := range rs {
		if r.err == nil && r.cpuPerTxnUS > 0 {
			v = append(v, r.cpuPerTxnUS)
		}
	}
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	return v[len(v)/2]
}

func verdict(goal string, met bool) string {
	if met {
		return goal + " met"
	}
	return goal + " MISSED"
}

func bridgeSnapshot() (string, error) {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/v1/bridges", adminPort))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var b strings.Builder
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 1<<16))
	for sc.Scan() {
		b.WriteString(sc.Text())
		b.WriteByte('\n')
	}
	return strings.TrimSpace(b.String()), sc.Err()
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
