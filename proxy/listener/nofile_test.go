//go:build unix

package listener

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/metrics"
	"github.com/warden-dev/warden/internal/testkit/fasttest"
	"github.com/warden-dev/warden/policy"
)

// The file-limit tests run a listener in a child process (this test
// binary again) whose RLIMIT_NOFILE is lowered, and flood it from here.
const (
	childEnv    = "WARDEN_LISTENER_CHILD" // the child's file limit
	childMaxEnv = "WARDEN_LISTENER_CHILD_MAX_CONNS"
	childNofile = 64
)

// A test binary started as the child runs it instead of the tests.
func init() {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
}

// runChild is the child: it serves 200s on a fasthttp listener in a Slot,
// prints its address, then answers commands on stdin, one per line, until
// stdin closes:
//
//	ready -> "ready ok" or "ready <Slot.Ready's error>"
//	stats -> "stats <accept errors> <refused> <connections>"
func runChild() int {
	nofile, _ := strconv.ParseUint(os.Getenv(childEnv), 10, 64)
	maxConns, _ := strconv.Atoi(os.Getenv(childMaxEnv))
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		fmt.Println("error", err)
		return 1
	}
	r.Cur = nofile
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		fmt.Println("error", err)
		return 1
	}
	m := metrics.New()
	log := slog.New(slog.DiscardHandler)
	slot := NewSlot("ingress", clock.Real{}, log, func(addr string, lim Limits) (Server, error) {
		h := func(ctx *fasthttp.RequestCtx) { ctx.WriteString("ok") }
		return Start(addr, ProxyServer(h, nil, log), lim, Config{Name: "ingress", Metrics: m, Log: log})
	})
	lim := Limits{MaxConns: maxConns, Timeouts: policy.ListenerTimeouts{Header: time.Minute, BodyIdle: time.Minute, Idle: time.Minute}}
	if err := slot.Bind("127.0.0.1:0", lim, func() error { return nil }); err != nil {
		fmt.Println("error", err)
		return 1
	}
	fmt.Println("addr", slot.Addr())
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		switch in.Text() {
		case "ready":
			if err := slot.Ready(true); err != nil {
				fmt.Println("ready", err)
			} else {
				fmt.Println("ready ok")
			}
		case "stats":
			fmt.Println("stats", fasttest.Value(m.ListenerAcceptErrors.WithLabelValues("ingress")),
				fasttest.Value(m.ListenerRefused.WithLabelValues("ingress")),
				fasttest.Value(m.ListenerConnections.WithLabelValues("ingress")))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = slot.Shutdown(ctx, func() error { return nil })
	return 0
}

type child struct {
	addr string
	in   io.WriteCloser
	out  *bufio.Scanner
}

// startChild runs the child with the file limit childNofile and the
// connection cap maxConns (0: none); it ends with the test.
func startChild(t *testing.T, maxConns int) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+strconv.Itoa(childNofile), childMaxEnv+"="+strconv.Itoa(maxConns))
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		in.Close() // the child shuts down and exits
		select {
		case <-exited:
		case <-time.After(10 * time.Second): // a failure bound
			_ = cmd.Process.Kill()
			<-exited
			t.Error("the child did not exit")
		}
	})
	c := &child{in: in, out: bufio.NewScanner(outR)}
	line := c.line(t)
	addr, ok := strings.CutPrefix(line, "addr ")
	if !ok {
		t.Fatalf("child: %s", line)
	}
	c.addr = addr
	return c
}

// line reads the child's next line (its stdout closes if it dies, and the
// read fails then).
func (c *child) line(t *testing.T) string {
	t.Helper()
	if !c.out.Scan() {
		t.Fatalf("the child ended: %v", c.out.Err())
	}
	return c.out.Text()
}

func (c *child) ask(t *testing.T, cmd string) string {
	t.Helper()
	if _, err := io.WriteString(c.in, cmd+"\n"); err != nil {
		t.Fatal(err)
	}
	return strings.TrimPrefix(c.line(t), cmd+" ")
}

// stats are the child's accept errors, refused connections and
// connections held.
func (c *child) stats(t *testing.T) (acceptErrs, refused, conns float64) {
	t.Helper()
	if _, err := fmt.Sscan(c.ask(t, "stats"), &acceptErrs, &refused, &conns); err != nil {
		t.Fatal(err)
	}
	return acceptErrs, refused, conns
}

// flood opens n idle connections to addr, asking the child whether it is
// ready after each; it returns them and the first readiness failure.
func flood(t *testing.T, c *child, n int) ([]net.Conn, string) {
	t.Helper()
	var conns []net.Conn
	t.Cleanup(func() {
		for _, nc := range conns {
			nc.Close()
		}
	})
	for range n {
		nc, err := net.DialTimeout("tcp", c.addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, nc)
		if r := c.ask(t, "ready"); r != "ok" {
			return conns, r
		}
	}
	return conns, ""
}

// serves waits until a request on a new connection gets its answer.
func serves(t *testing.T, addr string) {
	t.Helper()
	fasttest.WaitFor(t, "a request to be served", func() bool {
		st, err := get(addr, "/")
		return err == nil && st == 200
	})
}

// TestOutOfFilesDoesNotStopTheListener: idle clients take the process to
// its file limit; accept fails with EMFILE, the listener says it is not
// accepting, and once the clients leave it serves again.
func TestOutOfFilesDoesNotStopTheListener(t *testing.T) {
	c := startChild(t, 0)
	conns, notReady := flood(t, c, 4*childNofile)
	if !strings.Contains(notReady, "not accepting: accept4: too many open files") &&
		!strings.Contains(notReady, "not accepting: accept: too many open files") {
		t.Fatalf("readiness during the flood: %q, want the listener not accepting, out of files", notReady)
	}
	if errs, _, _ := c.stats(t); errs == 0 {
		t.Fatal("no accept error counted")
	}
	for _, nc := range conns {
		nc.Close()
	}
	serves(t, c.addr)
	fasttest.WaitFor(t, "the child to be ready again", func() bool { return c.ask(t, "ready") == "ok" })
}

// TestMaxConnsKeepsFilesFree: with a cap under the file limit, the same
// flood is refused at the cap, and accept never runs out of files.
func TestMaxConnsKeepsFilesFree(t *testing.T) {
	const maxConns = childNofile / 2
	c := startChild(t, maxConns)
	conns, notReady := flood(t, c, 4*childNofile)
	if notReady != "" {
		t.Fatalf("the listener became unready under a capped flood: %s", notReady)
	}
	errs, refused, held := c.stats(t)
	if errs != 0 || refused == 0 || held != maxConns {
		t.Fatalf("%v accept errors, %v refused, %v held; want 0, some, %d", errs, refused, held, maxConns)
	}
	for _, nc := range conns {
		nc.Close()
	}
	serves(t, c.addr)
}
