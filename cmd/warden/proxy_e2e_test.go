package main

import (
	"bufio"
	"context"
	"fmt"
	"github.com/warden-dev/warden/internal/testkit/loopback"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

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
		to := loopback.FreeAddr(t)
		addrs[a.name] = to
		s = strings.Replace(s, a.key+a.from, a.key+to, 1)
	}
	path = filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, addrs
}

// TestProxyEndToEnd is the acceptance check of the data plane: warden run
// with the example policy, then an HTTP_PROXY request (curl -x) to a local
// server goes through the egress and shows up in /metrics; SIGTERM lets an
// in-flight request finish and exits 0.
func TestProxyEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	target := "http://" + serveHTTP(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			entered <- struct{}{}
			<-release
		}
		fmt.Fprintf(w, "hello from %s", r.URL.Path)
	}) + "/"

	bin := buildWarden(t)
	policy, addrs := examplePolicy(t)
	p := start(t, bin, nil, "run", "--policy", policy, "--data-dir", t.TempDir())
	p.waitLog(t, "warden running")

	// curl -x http://EGRESS http://UPSTREAM/ when curl is installed; the
	// same request through Go's HTTP_PROXY support otherwise.
	var body string
	if curl, err := exec.LookPath("curl"); err == nil {
		out, err := exec.Command(curl, "-sS", "--max-time", "10", "-x", "http://"+addrs["egress"], target).CombinedOutput()
		if err != nil {
			t.Fatalf("curl: %v\n%s", err, out)
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
	_, metrics := get(t, "http://"+addrs["admin"]+"/metrics")
	counted := regexp.MustCompile(`warden_requests_total\{code="200",listener="egress",target="_unlisted"\} 1\b`)
	if !counted.MatchString(metrics) {
		t.Fatalf("the request is not in /metrics:\n%s", grep(metrics, "warden_requests_total"))
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
			close(release)
			t.Fatal("egress listener still accepting after SIGTERM")
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(release)
	if got := <-slow; got != "hello from /slow" {
		t.Fatalf("in-flight request at SIGTERM: %q", got)
	}
	p.exitsZero(t, 30*time.Second)
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

// TestShutdownGraceCuts: work still in flight when shutdown_grace ends (a
// request the worker holds, an idle CONNECT tunnel) is cut, the cut is
// logged, and SIGTERM still exits 0.
func TestShutdownGraceCuts(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	upAddr := serveHTTP(t, func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-release
	})
	defer close(release)

	admin, ingress, egress := loopback.FreeAddr(t), loopback.FreeAddr(t), loopback.FreeAddr(t)
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte(fmt.Sprintf(`version: 1
shutdown_grace: 1s
admin: { listen: %s }
ingress: { listen: %s, worker: "http://%s" }
egress: { http_listen: %s }
`, admin, ingress, upAddr, egress)), 0o644); err != nil {
		t.Fatal(err)
	}
	p := start(t, buildWarden(t), nil, "run", "--policy", policy, "--data-dir", t.TempDir())
	p.waitLog(t, "warden running")

	// An idle tunnel through the egress.
	tc, err := net.Dial("tcp", egress)
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	fmt.Fprintf(tc, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", upAddr, upAddr)
	tc.SetReadDeadline(time.Now().Add(10 * time.Second))
	tr := bufio.NewReader(tc)
	resp, err := http.ReadResponse(tr, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v, %v", resp, err)
	}
	// A request the worker holds past the grace.
	held := make(chan error, 1)
	go func() {
		c := &http.Client{Timeout: 20 * time.Second}
		resp, err := c.Get("http://" + ingress + "/held")
		if err == nil {
			resp.Body.Close()
			err = fmt.Errorf("answered %s", resp.Status)
		}
		held <- err
	}()
	<-entered

	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	p.waitLog(t, "shutdown_grace ended")
	p.exitsZero(t, 15*time.Second)
	if err := <-held; err == nil {
		t.Fatal("the held request was answered")
	}
	if n, err := tr.Read(make([]byte, 1)); err == nil {
		t.Fatalf("the tunnel is still open after warden exited (read %d bytes)", n)
	}
}
