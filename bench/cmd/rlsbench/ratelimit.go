package main

// The envoyproxy/ratelimit baseline: the rate limit service users run
// when they do not run warden's, started from the binary `make bench-rls`
// builds from its Go module (github.com/envoyproxy/ratelimit/src/service_cmd,
// never vendored here) and configured the way its README says: environment
// variables, and a runtime directory holding a config YAML equivalent to
// rlsPolicy (same domain, descriptor key, limit and window).

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// ratelimitConfig is rlsPolicy in envoyproxy/ratelimit's terms: a key-only
// descriptor counts each value in its own window, as warden's does.
const ratelimitConfig = `domain: bench
descriptors:
  - key: tenant
    rate_limit:
      unit: hour
      requests_per_unit: 2000000000
`

// ratelimitServer is one running envoyproxy/ratelimit process.
type ratelimitServer struct {
	cmd    *exec.Cmd
	addr   string // its gRPC listener
	dir    string // RUNTIME_ROOT, removed on stop
	exited chan struct{}
}

// ratelimitVersion names the module version the binary was built from.
func ratelimitVersion(bin string) string {
	bi, err := buildinfo.ReadFile(bin)
	if err != nil {
		return "not built"
	}
	return bi.Main.Path + "@" + bi.Main.Version
}

// whyNotBuilt explains a missing binary with the build log the Makefile
// leaves beside it, on one line.
func whyNotBuilt(bin string) string {
	b, err := os.ReadFile(filepath.Join(filepath.Dir(bin), "build.log"))
	if err != nil {
		return bin + " is missing (build it with `make bench-rls`)"
	}
	why := strings.Join(strings.Fields(string(b)), " ")
	if len(why) > 240 {
		why = why[:240] + "…"
	}
	return "did not build: " + why
}

// ratelimitEnv is its settings (src/settings/settings.go): Redis over TCP,
// listeners on loopback ports of ours, keys under this run's prefix so
// that cleanup removes them, its defaults otherwise. Stats: not StatsD
// (USE_STATSD=false) but its Prometheus sink, kept in memory for a scrape
// as warden's /metrics are; with neither, USE_STATSD=false logs a JSON
// line per call to stdout, a cost no deployment pays.
func ratelimitEnv(o options, dir string) ([]string, error) {
	u, err := url.Parse(o.url)
	if err != nil {
		return nil, fmt.Errorf("parsing -redis: %w", err)
	}
	if db := strings.Trim(u.Path, "/"); db != "" && db != "0" {
		return nil, fmt.Errorf("-redis selects database %s; envoyproxy/ratelimit only uses 0", db)
	}
	ports, err := freePorts(4)
	if err != nil {
		return nil, err
	}
	env := append(os.Environ(),
		"USE_STATSD=false", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+u.Host,
		"RUNTIME_ROOT="+dir, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_APPDIRECTORY=config",
		"CACHE_KEY_PREFIX="+o.prefix+"ratelimit:",
		"HOST=127.0.0.1", "PORT="+ports[0], "DEBUG_HOST=127.0.0.1", "DEBUG_PORT="+ports[1],
		"GRPC_HOST=127.0.0.1", "GRPC_PORT="+ports[2],
		"USE_PROMETHEUS=true", "PROMETHEUS_ADDR=127.0.0.1:"+ports[3])
	if p, ok := u.User.Password(); ok {
		env = append(env, "REDIS_AUTH="+p)
	}
	for _, kv := range strings.Split(o.ratelimitEnv, ",") {
		if kv = strings.TrimSpace(kv); kv != "" {
			env = append(env, kv)
		}
	}
	return env, nil
}

// freePorts finds n loopback ports nobody listens on.
func freePorts(n int) ([]string, error) {
	var ports []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, strconv.Itoa(l.Addr().(*net.TCPAddr).Port))
	}
	return ports, nil
}

// startRatelimit starts the server and waits until it answers OK for the
// bench domain (its config loaded, Redis reached).
func startRatelimit(o options) (*ratelimitServer, error) {
	if o.ratelimit == "" {
		return nil, errors.New("no -ratelimit binary given")
	}
	if _, err := os.Stat(o.ratelimit); err != nil {
		return nil, errors.New(whyNotBuilt(o.ratelimit))
	}
	dir, err := os.MkdirTemp("", "rlsbench-ratelimit-")
	if err != nil {
		return nil, fmt.Errorf("creating its runtime directory: %w", err)
	}
	conf := filepath.Join(dir, "ratelimit", "config")
	if err := os.MkdirAll(conf, 0o755); err == nil {
		err = os.WriteFile(filepath.Join(conf, "bench.yaml"), []byte(ratelimitConfig), 0o644)
	}
	env, err2 := ratelimitEnv(o, dir)
	if err = errors.Join(err, err2); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("configuring envoyproxy/ratelimit: %w", err)
	}
	logf, err := os.OpenFile(ratelimitLog(o), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("opening its log: %w", err)
	}
	defer logf.Close() // the child holds its own descriptor
	cmd := exec.Command(o.ratelimit)
	cmd.Env, cmd.Stdout, cmd.Stderr = env, logf, logf
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("starting %s: %w", o.ratelimit, err)
	}
	s := &ratelimitServer{cmd: cmd, dir: dir, exited: make(chan struct{})}
	for _, kv := range env {
		if p, ok := strings.CutPrefix(kv, "GRPC_PORT="); ok {
			s.addr = "127.0.0.1:" + p
		}
	}
	go func() { _ = cmd.Wait(); close(s.exited) }()
	if err := s.ready(20 * time.Second); err != nil {
		s.stop()
		return nil, fmt.Errorf("%w (log: %s)", err, ratelimitLog(o))
	}
	return s, nil
}

// ratelimitLog is where the server's output goes, beside its binary.
func ratelimitLog(o options) string { return filepath.Join(filepath.Dir(o.ratelimit), "server.log") }

func (s *ratelimitServer) ready(limit time.Duration) error {
	conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	c := rlspb.NewRateLimitServiceClient(conn)
	req := &rlspb.RateLimitRequest{Domain: "bench", Descriptors: []*commonpb.RateLimitDescriptor{
		{Entries: []*commonpb.RateLimitDescriptor_Entry{{Key: "tenant", Value: "ready"}}}}}
	deadline := time.Now().Add(limit)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := c.ShouldRateLimit(ctx, req)
		cancel()
		if err == nil && resp.OverallCode == rlspb.RateLimitResponse_OK && len(resp.Statuses) == 1 &&
			resp.Statuses[0].CurrentLimit != nil {
			return nil // answered from the bench config, not a default OK
		}
		select {
		case <-s.exited:
			return errors.New("envoyproxy/ratelimit exited while starting")
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("envoyproxy/ratelimit not ready after %s (last answer %v, %v)", limit, resp, err)
		}
	}
}

// cpu is the server's CPU time so far (all threads, user+system), from
// /proc/PID/stat in clock ticks of 1/100 s.
func (s *ratelimitServer) cpu() float64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(s.cmd.Process.Pid) + "/stat")
	if err != nil {
		return 0
	}
	// Fields after "pid (comm) ": state is the first; utime, stime the 12th, 13th.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (u + st) / 100
}

// stop ends the server by its PID: SIGTERM, then SIGKILL if it has not
// exited 5 s later.
func (s *ratelimitServer) stop() {
	defer os.RemoveAll(s.dir)
	kill := time.AfterFunc(5*time.Second, func() { _ = s.cmd.Process.Kill() })
	defer kill.Stop()
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	<-s.exited
}

// withRatelimit starts envoyproxy/ratelimit and runs the load against it,
// or says why it could not.
func withRatelimit(o options, client string) (result, error) {
	s, err := startRatelimit(o)
	if err != nil {
		return result{}, err
	}
	defer s.stop()
	return measureRLS(o, s.addr, client, s.cpu), nil
}
