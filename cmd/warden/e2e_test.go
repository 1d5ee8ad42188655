package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// buildWarden compiles the real binary once per test run.
func buildWarden(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "warden")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// examplePolicy is policies.example.yaml with every listener moved to a
// free loopback port, so the test runs beside anything else on the machine.
func examplePolicy(t *testing.T) (path string, addrs map[string]string) {
	t.Helper()
	b, err := os.ReadFile("../../policies.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	addrs = map[string]string{}
	for _, a := range []struct{ name, key, from string }{
		{"admin", "listen: ", "127.0.0.1:9901"}, {"ingress", "listen: ", "0.0.0.0:8080"},
		{"egress", "http_listen: ", "127.0.0.1:15001"}, {"grpc", "grpc_listen: ", "127.0.0.1:15002"},
		{"bridge", "listen: ", "127.0.0.1:15432"}, {"rls", "listen: ", "127.0.0.1:8081"},
	} {
		if !strings.Contains(s, a.key+a.from) {
			t.Fatalf("example policy no longer has %q", a.key+a.from)
		}
		to := freePort(t)
		addrs[a.name] = to
		s = strings.Replace(s, a.key+a.from, a.key+to, 1)
	}
	path = filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, addrs
}

type process struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{} // closed when the process has exited
	err  error         // its exit status, once done is closed
}

// syncBuffer is the process's output, written by exec's copying goroutine
// and read by the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// exited waits up to d for the process to exit and returns its status.
func (p *process) exited(d time.Duration) (error, bool) {
	select {
	case <-p.done:
		return p.err, true
	case <-time.After(d):
		return nil, false
	}
}

func startWarden(t *testing.T, bin, policy string) *process {
	t.Helper()
	p := &process{out: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, "run", "--policy", policy, "--data-dir", t.TempDir())
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		if _, ok := p.exited(0); !ok {
			_ = p.cmd.Process.Kill() // by PID
			<-p.done
		}
	})
	return p
}

// waitHealthy polls the admin listener until warden answers.
func (p *process) waitHealthy(t *testing.T, admin string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if err, ok := p.exited(0); ok {
			t.Fatalf("warden exited: %v\n%s", err, p.out)
		}
		if resp, err := http.Get("http://" + admin + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("warden never became healthy:\n%s", p.out)
}

// TestBinaryEgressCountedInMetrics is the acceptance check of the data
// plane: warden run with the example policy, then an HTTP_PROXY request
// (curl -x) to a local server goes through the egress and shows up in
// /metrics; SIGTERM lets an in-flight request finish and exits 0.
func TestBinaryEgressCountedInMetrics(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	upstream := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			entered <- struct{}{}
			<-release
		}
		fmt.Fprintf(w, "hello from %s", r.URL.Path)
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go upstream.Serve(ln)
	defer upstream.Close()
	target := "http://" + ln.Addr().String() + "/"

	bin := buildWarden(t)
	policy, addrs := examplePolicy(t)
	p := startWarden(t, bin, policy)
	p.waitHealthy(t, addrs["admin"])

	// curl -x http://EGRESS http://UPSTREAM/ when curl is installed; the
	// same request through Go's HTTP_PROXY support otherwise.
	var body string
	if curl, err := exec.LookPath("curl"); err == nil {
		out, err := exec.Command(curl, "-sS", "--max-time", "10", "-x", "http://"+addrs["egress"], target).CombinedOutput()
		if err != nil {
			t.Fatalf("curl: %v\n%s\nwarden:\n%s", err, out, p.out)
		}
		body = string(out)
	} else {
		proxy, _ := url.Parse("http://" + addrs["egress"])
		c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxy)}, Timeout: 10 * time.Second}
		resp, err := c.Get(target)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		c.CloseIdleConnections()
		body = string(b)
	}
	if body != "hello from /" {
		t.Fatalf("through the egress: %q", body)
	}
	resp, err := http.Get("http://" + addrs["admin"] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	counted := regexp.MustCompile(`warden_requests_total\{code="200",listener="egress",target="_unlisted"\} 1\b`)
	if !counted.Match(metrics) {
		t.Fatalf("the request is not in /metrics:\n%s", grep(string(metrics), "warden_requests_total"))
	}

	// Graceful drain: a request in flight at SIGTERM still completes.
	proxy, _ := url.Parse("http://" + addrs["egress"])
	tr := &http.Transport{Proxy: http.ProxyURL(proxy)}
	defer tr.CloseIdleConnections()
	slow := make(chan string, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", target+"slow", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			slow <- "error: " + err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		slow <- string(b)
	}()
	<-entered
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The listener closes while the request is held.
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addrs["egress"], time.Second)
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("egress listener still accepting after SIGTERM")
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(release)
	if got := <-slow; got != "hello from /slow" {
		t.Fatalf("in-flight request at SIGTERM: %q", got)
	}
	err, ok := p.exited(30 * time.Second)
	if !ok {
		t.Fatalf("warden did not exit after SIGTERM:\n%s", p.out)
	}
	if err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, p.out)
	}
}

func grep(s, what string) string {
	var out []string
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, what) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
