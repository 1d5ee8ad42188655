package scheduler

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warden-dev/warden/governor"
	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/metrics"
	"github.com/warden-dev/warden/governor/window"
	"github.com/warden-dev/warden/policy"
)

// The crash tests run a warden-like child: this test binary re-executed
// with childEnv set serves the scheduler's handler with the bbolt store of
// a data directory on a port it prints, until it is killed or receives
// SIGTERM (then it drains like warden and exits 0).
const (
	childEnv       = "WARDEN_SCHED_CHILD"
	childPolicyEnv = "WARDEN_SCHED_CHILD_POLICY"
	childDirEnv    = "WARDEN_SCHED_CHILD_DIR"
	childLeaseEnv  = "WARDEN_SCHED_CHILD_LEASE" // claim lease on a shared store
)

func childMain() int {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	p, err := policy.Load(os.Getenv(childPolicyEnv))
	if err != nil {
		log.Error("policy", "err", err)
		return 1
	}
	clk := clock.Real{}
	gov := governor.New(clk, metrics.New(), window.NewMemory(clk))
	lease, _ := time.ParseDuration(os.Getenv(childLeaseEnv))
	s := New(Options{Clock: clk, Log: log, DataDir: os.Getenv(childDirEnv), Lease: lease})
	if err := s.Apply(context.Background(), gov.Apply(p)); err != nil {
		log.Error("start", "err", err)
		return 1
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Error("listen", "err", err)
		return 1
	}
	srv := &fasthttp.Server{Handler: s.Handler()}
	go srv.Serve(ln)
	fmt.Printf("LISTEN %s\n", ln.Addr())
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	<-term
	srv.Shutdown()
	ctx, cancel := context.WithTimeout(context.Background(), p.ShutdownGrace)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		log.Error("drain", "err", err)
		return 1
	}
	return 0
}

type child struct {
	cmd    *exec.Cmd
	base   string
	stderr *strings.Builder
	exited chan struct{} // closed once the process is reaped
	err    error         // its exit status, valid after exited
}

func (c *child) wait() error {
	<-c.exited
	return c.err
}

func startChild(t *testing.T, policyFile, dir string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", childPolicyEnv+"="+policyFile, childDirEnv+"="+dir)
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, stderr: &strings.Builder{}, exited: make(chan struct{})}
	cmd.Stderr = &lockedWriter{w: c.stderr}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "LISTEN ") {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("child did not start: %q %v\n%s", line, err, c.stderr)
	}
	go func() {
		io.Copy(io.Discard, out)
		c.err = cmd.Wait()
		close(c.exited)
	}()
	c.base = "http://" + strings.TrimSpace(strings.TrimPrefix(line, "LISTEN ")) + "/v1/runs"
	t.Cleanup(func() {
		cmd.Process.Kill()
		c.wait()
	})
	return c
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// kill -9 a warden with 100 queued runs and 5 at the worker, restart it:
// every run ends COMPLETED; the worker saw each run exactly once, except
// the five it held at the crash, which were delivered once more with the
// next x-run-attempt. Then SIGTERM drains the second process cleanly.
func TestKill9LosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	var mu sync.Mutex
	held := 0
	release := make(chan struct{})
	w := newWorker(t, func(d delivery) (int, string) {
		mu.Lock()
		hold := held < 5
		if hold {
			held++
		}
		mu.Unlock()
		if hold {
			<-release
		}
		return 200, `{"ok":true}`
	})
	dir := t.TempDir()
	policyFile := filepath.Join(dir, "policy.yaml")
	yaml := policyYAML(w.srv.URL, `
  lanes: 5
  definitions:
    job: { retry: { count: 1, delay: 0s } }`, "")
	if err := os.WriteFile(policyFile, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer client.CloseIdleConnections()

	first := startChild(t, policyFile, dir)
	const n = 105
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := client.Post(first.base, "application/json", strings.NewReader(fmt.Sprintf(`{"name":"job","input":{"i":%d}}`, i)))
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			var v RunView
			if err := decodeJSON(resp.Body, &v); err != nil || resp.StatusCode != http.StatusAccepted {
				t.Errorf("submit %d: %d %v", i, resp.StatusCode, err)
				return
			}
			ids[i] = v.ID
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	heldIDs := map[string]bool{}
	for range 5 {
		heldIDs[w.next(t).id] = true
	}
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	first.wait()
	close(release) // the held runs finish into dead connections

	second := startChild(t, policyFile, dir)
	deadline := time.Now().Add(30 * time.Second)
	for {
		var done []RunView
		resp, err := client.Get(second.base + "?status=COMPLETED&limit=1000")
		if err == nil {
			decodeJSON(resp.Body, &done)
			resp.Body.Close()
		}
		if len(done) == n {
			for _, v := range done {
				want := 1
				if heldIDs[v.ID] {
					want = 2
				}
				if v.Attempt != want {
					t.Errorf("run %s completed on attempt %d, want %d", v.ID, v.Attempt, want)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d runs COMPLETED after the restart\n%s", len(done), n, second.stderr)
		}
		time.Sleep(5 * time.Millisecond)
	}
	seen := map[string][]string{}
	for _, d := range w.deliveries() {
		seen[d.id] = append(seen[d.id], d.attempt)
	}
	for _, id := range ids {
		want := "[1]"
		if heldIDs[id] {
			want = "[1 2]"
		}
		if got := fmt.Sprint(seen[id]); got != want {
			t.Errorf("run %s reached the worker with attempts %s, want %s", id, got, want)
		}
	}
	if len(seen) != n {
		t.Errorf("the worker saw %d distinct runs, want %d", len(seen), n)
	}

	if err := second.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := second.wait(); err != nil {
		t.Fatalf("SIGTERM: child exited with %v\n%s", err, second.stderr)
	}
}
