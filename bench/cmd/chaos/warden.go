package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// warden is the built binary, run as a child on a policy the scenario
// wrote, with its data directory in the scenario's temporary directory and
// its log in the output directory.
type warden struct {
	s          *scenario
	policyPath string
	dataDir    string
	logPath    string
	admin      string // host:port of the admin listener
	nofile     int    // RLIMIT_NOFILE for the child; 0 keeps the harness's
	client     *http.Client

	mu sync.Mutex
	p  *proc
}

// newWarden writes policy to the scenario's directory; admin is the
// address the policy gives the admin listener.
func (s *scenario) newWarden(policy, admin string) (*warden, error) {
	w := &warden{
		s:          s,
		policyPath: filepath.Join(s.dir, "policy.yaml"),
		dataDir:    filepath.Join(s.dir, "data"),
		logPath:    filepath.Join(s.env.logDir, s.name+"-warden.log"),
		admin:      admin,
		// Two connections at most (the sampler's scrape and one poller):
		// the harness's own connections would otherwise come and go in
		// warden's descriptor count.
		client: &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{MaxConnsPerHost: 2, MaxIdleConnsPerHost: 2}},
	}
	if err := os.WriteFile(w.policyPath, []byte(policy), 0o644); err != nil {
		return nil, err
	}
	return w, nil
}

// start runs warden and waits until /readyz answers 200.
func (w *warden) start(ctx context.Context) error {
	bin, args := w.s.env.warden, []string{"run", "--policy", w.policyPath, "--data-dir", w.dataDir, "--log-format", "text"}
	if w.nofile > 0 {
		args = append([]string{"rlimit-exec", strconv.Itoa(w.nofile), bin}, args...)
		bin = w.s.env.self
	}
	p, err := w.s.env.procs.start(spawn{name: "warden", logPath: w.logPath, bin: bin, args: args})
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.p = p
	w.mu.Unlock()
	return w.waitReady(ctx, 30*time.Second)
}

// waitReady waits for /readyz 200, failing if warden exits first.
func (w *warden) waitReady(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		code, body, err := w.get(ctx, "/readyz")
		if err == nil && code == 200 {
			return nil
		}
		if w.cur() == nil || w.cur().exited() {
			return fmt.Errorf("warden exited while starting (log: %s): %s", w.logPath, tail(w.logPath, 5))
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("warden not ready after %v: %d %s %v (log: %s)", limit, code, body, err, w.logPath)
		}
		time.Sleep(50 * time.Millisecond) // readiness has no event to wait on from outside
	}
}

func (w *warden) cur() *proc {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.p
}

// pid is the running warden's PID, 0 when none runs.
func (w *warden) pid() int {
	p := w.cur()
	if p == nil || p.exited() {
		return 0
	}
	return p.pid()
}

// kill9 is kill -9 by PID.
func (w *warden) kill9() {
	if p := w.cur(); p != nil {
		p.kill()
	}
}

// stop is SIGTERM (warden drains), then SIGKILL after 20 s.
func (w *warden) stop() {
	if p := w.cur(); p != nil {
		p.stop(syscall.SIGTERM, 20*time.Second)
	}
}

// get is a GET on the admin listener.
func (w *warden) get(ctx context.Context, path string) (int, []byte, error) {
	return httpGet(ctx, w.client, "http://"+w.admin+path, 64<<20)
}

// httpGet reads at most limit bytes of the answer.
func httpGet(ctx context.Context, c *http.Client, url string, limit int64) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	return resp.StatusCode, b, err
}

// metric sums the samples of a metric family on /metrics whose line
// contains every one of labels (e.g. `listener="ingress"`).
func (w *warden) metric(ctx context.Context, name string, labels ...string) (float64, error) {
	code, body, err := w.get(ctx, "/metrics")
	if err != nil {
		return 0, err
	}
	if code != 200 {
		return 0, fmt.Errorf("/metrics: %d", code)
	}
	return sumMetric(body, name, labels...), nil
}

func sumMetric(body []byte, name string, labels ...string) float64 {
	var sum float64
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		match := true
		for _, l := range labels {
			if !strings.Contains(rest, l) {
				match = false
			}
		}
		if !match {
			continue
		}
		f := strings.Fields(rest)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			sum += v
		}
	}
	return sum
}

// goroutines is go_goroutines from /metrics.
func (w *warden) goroutines(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	code, body, err := w.get(ctx, "/metrics")
	if err != nil {
		return 0, err
	}
	if code != 200 || !bytes.Contains(body, []byte("\ngo_goroutines ")) {
		return 0, errors.New("no go_goroutines")
	}
	return int(sumMetric(body, "go_goroutines")), nil
}

// tail is the last n lines of a file, for error messages.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
