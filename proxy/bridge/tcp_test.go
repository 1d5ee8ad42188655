package bridge

import (
	"bufio"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/internal/testkit/loopback"
	"github.com/warden-dev/warden/policy"
)

// echoServer is a loopback upstream that echoes.
func echoServer(t *testing.T) string { return upstreamServer(t, "") }

// upstreamServer is a loopback upstream that says hello (if not empty),
// then echoes.
func upstreamServer(t *testing.T, hello string) string {
	return loopback.Serve(t, func(c net.Conn) {
		if hello != "" {
			_, _ = io.WriteString(c, hello+"\n")
		}
		_, _ = io.Copy(c, c)
	})
}

type tcpClient struct {
	t *testing.T
	c net.Conn
	r *bufio.Reader
}

func (h *harness) dialTCP(name string) *tcpClient {
	h.t.Helper()
	c := h.dial(name)
	return &tcpClient{t: h.t, c: c, r: bufio.NewReader(c)}
}

func (c *tcpClient) send(line string) {
	c.t.Helper()
	if _, err := io.WriteString(c.c, line+"\n"); err != nil {
		c.t.Fatal(err)
	}
}

func (c *tcpClient) echo(line string) {
	c.t.Helper()
	c.send(line)
	got, err := c.r.ReadString('\n')
	if err != nil || got != line+"\n" {
		c.t.Fatalf("echo of %q: %q, %v", line, got, err)
	}
}

func (c *tcpClient) closedByBridge() {
	c.t.Helper()
	if _, err := c.r.ReadByte(); !errors.Is(err, io.EOF) && !isReset(err) {
		c.t.Fatalf("still open: %v", err)
	}
}

func tcpBridge(name, upstream string, mods ...func(*policy.Bridge)) policy.Bridge {
	b := policy.Bridge{Name: name, Listen: "127.0.0.1:0", Upstream: upstream, Protocol: policy.ProtocolTCP,
		MaxConnections: 2, WaitTimeout: 5 * time.Second}
	for _, m := range mods {
		m(&b)
	}
	return b
}

func TestTCPCappedPipe(t *testing.T) {
	clk := clock.NewFake(t0)
	h := newHarness(t, clk, nil)
	h.mustApply(tcpBridge("pipe", echoServer(t)))
	a, b := h.dialTCP("pipe"), h.dialTCP("pipe")
	a.echo("alpha")
	b.echo("beta")

	// A third client waits; what it sends meanwhile is delivered once it is
	// served.
	armed := clk.TimerArmed()
	c := h.dialTCP("pipe")
	<-armed
	c.send("early")
	if s := h.bridge("pipe").snapshot(clk.Now()); s.Waiting != 1 || s.Live != 2 {
		t.Fatalf("snapshot %+v", s)
	}
	a.c.Close()
	got, err := c.r.ReadString('\n')
	if err != nil || got != "early\n" {
		t.Fatalf("early bytes: %q %v", got, err)
	}
	c.echo("gamma")

	// A fourth waits past wait_timeout and is closed.
	armed = clk.TimerArmed()
	d := h.dialTCP("pipe")
	<-armed
	clk.Advance(5 * time.Second)
	d.closedByBridge()
	b.echo("still here")
}

func TestTCPIdleTimeout(t *testing.T) {
	clk := clock.NewFake(t0)
	h := newHarness(t, clk, nil)
	h.mustApply(tcpBridge("quiet", echoServer(t), func(b *policy.Bridge) { b.IdleTimeout = 10 * time.Second }))
	a := h.dialTCP("quiet")
	a.echo("hello")
	advanceUntil(t, clk, 10*time.Second, h.until("quiet", func(s Snapshot) bool { return s.Reaped[ReasonIdle] == 1 }))
	a.closedByBridge()
}

// A tcp client that resets its connection is reaped as gone; one that
// closes cleanly simply ends.
func TestTCPClientGone(t *testing.T) {
	h := newHarness(t, clock.Real{}, nil)
	h.mustApply(tcpBridge("gone", echoServer(t)))
	a := h.dialTCP("gone")
	a.echo("x")
	_ = a.c.(*net.TCPConn).SetLinger(0)
	a.c.Close()
	h.reaped("gone", ReasonClientGone, 1)
	b := h.dialTCP("gone")
	b.echo("y")
	b.c.Close()
	h.waitFor("gone", "the session over", func(s Snapshot) bool { return s.Live == 0 })
	if s := h.bridge("gone").snapshot(time.Now()); s.Reaped[ReasonClientGone] != 1 {
		t.Fatalf("clean close counted as a reap: %+v", s)
	}
}

// StopAccepting refuses new clients at once, while a client already in a
// session is served until Shutdown drains it; a reload is refused.
func TestTCPStopAccepting(t *testing.T) {
	h := newHarness(t, clock.Real{}, nil)
	h.mustApply(tcpBridge("pipe", echoServer(t)))
	addr := h.addr("pipe")
	a := h.dialTCP("pipe")
	a.echo("before")
	h.set.StopAccepting()
	if c, err := net.DialTimeout("tcp", addr, 5*time.Second); err == nil {
		c.Close()
		t.Fatal("the bridge accepts a client after StopAccepting")
	}
	a.echo("after")
	if err := h.apply(tcpBridge("pipe", echoServer(t))); err == nil {
		t.Fatal("a reload after StopAccepting was applied")
	}
	a.c.Close()
}

// requestServer is a loopback upstream that reads a request to EOF (the
// client's half-close), replies "got <request>" and closes.
func requestServer(t *testing.T) string {
	return loopback.Serve(t, func(c net.Conn) {
		req, err := io.ReadAll(c)
		if err == nil {
			_, _ = io.WriteString(c, "got "+string(req))
		}
	})
}

// request sends req, half-closes and returns all the bridge sends back
// until it closes.
func (c *tcpClient) request(req string) string {
	c.t.Helper()
	if _, err := io.WriteString(c.c, req); err != nil {
		c.t.Fatal(err)
	}
	if err := c.c.(*net.TCPConn).CloseWrite(); err != nil {
		c.t.Fatal(err)
	}
	return c.readAll()
}

func (c *tcpClient) readAll() string {
	c.t.Helper()
	got, err := io.ReadAll(c.r)
	if err != nil {
		c.t.Fatalf("reply: %q, %v", got, err)
	}
	return string(got)
}

// A tcp client that sends its request and then half-closes (shutdown
// SHUT_WR: done sending, now reading) gets the upstream's whole reply, as
// from a direct connection: its EOF is passed on as a half-close of the
// upstream side, and the session ends, freeing the slot, when the upstream
// closes too. That is a normal end, not a reap.
func TestTCPHalfClose(t *testing.T) {
	cases := []struct {
		name string
		wait bool // the client waits for the slot, and half-closes meanwhile
	}{
		{"with a free slot", false},
		// It keeps its turn: its bytes and its half-close are delivered
		// once it has a connection.
		{"while waiting for a slot", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			eof := make(chan struct{}, 1)
			h := newHarness(t, clock.Real{}, nil)
			h.set.keptAtEOF = func() { eof <- struct{}{} }
			h.mustApply(tcpBridge("half", requestServer(t), func(b *policy.Bridge) { b.MaxConnections = 1 }))
			if !tc.wait {
				if got := h.dialTCP("half").request("select 1"); got != "got select 1" {
					t.Fatalf("reply %q, want %q", got, "got select 1")
				}
			} else {
				holder := h.dialTCP("half")
				h.waitFor("half", "the slot taken", func(s Snapshot) bool { return s.Live == 1 })
				c := h.dialTCP("half")
				h.waitFor("half", "the client waiting", func(s Snapshot) bool { return s.Waiting == 1 })
				if _, err := io.WriteString(c.c, "early request"); err != nil {
					t.Fatal(err)
				}
				if err := c.c.(*net.TCPConn).CloseWrite(); err != nil {
					t.Fatal(err)
				}
				reply := make(chan string, 1)
				go func() {
					got, _ := io.ReadAll(c.r)
					reply <- string(got)
				}()
				select {
				case <-eof:
				case got := <-reply:
					t.Fatalf("the waiting client was closed at its half-close (got %q)", got)
				case <-time.After(10 * time.Second):
					t.Fatal("the bridge never read the waiting client's half-close")
				}
				if s := h.bridge("half").snapshot(time.Now()); s.Waiting != 1 {
					t.Fatalf("the client left the queue: %+v", s)
				}
				if got := holder.request("first"); got != "got first" {
					t.Fatalf("holder's reply %q", got)
				}
				if got := <-reply; got != "got early request" {
					t.Fatalf("reply %q, want %q", got, "got early request")
				}
			}
			s := h.waitFor("half", "the slot freed", func(s Snapshot) bool { return s.Live == 0 && s.Waiting == 0 })
			for _, reason := range Reasons {
				if s.Reaped[reason] != 0 {
					t.Errorf("%d %s reaps counted", s.Reaped[reason], reason)
				}
			}
		})
	}
}

// A half-closed session whose upstream never closes does not hold its slot
// forever: idle_timeout applies as to any session.
func TestTCPHalfClosedIdleTimeout(t *testing.T) {
	clk := clock.NewFake(t0)
	h := newHarness(t, clk, nil)
	halfClosed, testOver := make(chan struct{}), make(chan struct{})
	silent := loopback.Serve(t, func(c net.Conn) {
		_, _ = io.Copy(io.Discard, c) // reads to EOF, then neither replies nor closes
		close(halfClosed)
		<-testOver
	})
	t.Cleanup(func() { close(testOver) }) // runs before the server's cleanup
	h.mustApply(tcpBridge("silent", silent, func(b *policy.Bridge) { b.IdleTimeout = 10 * time.Second }))
	c := h.dialTCP("silent")
	if _, err := io.WriteString(c.c, "anyone?"); err != nil {
		t.Fatal(err)
	}
	if err := c.c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	<-halfClosed // the bridge passed the half-close on
	if s := h.bridge("silent").snapshot(clk.Now()); s.Live != 1 {
		t.Fatalf("the half-closed session is gone before idle_timeout: %+v", s)
	}
	advanceUntil(t, clk, 10*time.Second, h.until("silent", func(s Snapshot) bool { return s.Reaped[ReasonIdle] == 1 }))
	if got := c.readAll(); got != "" {
		t.Fatalf("got %q", got)
	}
	h.waitFor("silent", "the slot freed", func(s Snapshot) bool { return s.Live == 0 })
}
