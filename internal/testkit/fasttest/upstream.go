package fasttest

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warden-dev/warden/governor/clock"
)

// Upstream is a fasthttp server on loopback that counts what reaches it:
// requests reaching the handler, requests in the handler at once (and the
// peak), connections opened.
type Upstream struct {
	Addr     string
	Srv      *fasthttp.Server
	Requests atomic.Int64
	InFlight atomic.Int64
	Peak     atomic.Int64
	Conns    atomic.Int64

	handler atomic.Pointer[fasthttp.RequestHandler]
	mu      sync.Mutex
	paths   []string
	// NoPaths stops recording paths (benchmarks: recording allocates).
	NoPaths atomic.Bool
}

// StartUpstream serves h on 127.0.0.1 until the test ends. Request bodies
// are streamed to h (ctx.RequestBodyStream) so large uploads need no
// memory.
func StartUpstream(t testing.TB, h fasthttp.RequestHandler) *Upstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &Upstream{Addr: ln.Addr().String()}
	u.Handle(h)
	u.Srv = &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			u.Requests.Add(1)
			if !u.NoPaths.Load() {
				u.mu.Lock()
				u.paths = append(u.paths, string(ctx.Path()))
				u.mu.Unlock()
			}
			n := u.InFlight.Add(1)
			for p := u.Peak.Load(); n > p && !u.Peak.CompareAndSwap(p, n); p = u.Peak.Load() {
			}
			defer u.InFlight.Add(-1)
			(*u.handler.Load())(ctx)
		},
		ConnState: func(_ net.Conn, st fasthttp.ConnState) {
			if st == fasthttp.StateNew {
				u.Conns.Add(1)
			}
		},
		StreamRequestBody: true,
		CloseOnShutdown:   true,
		NoDefaultDate:     true,
		Logger:            quiet{},
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = u.Srv.Serve(ln) }()
	t.Cleanup(func() {
		_ = u.Srv.Shutdown()
		// Shutdown does nothing when Serve has not registered the listener
		// yet (a test that never sent a request, on a loaded machine);
		// closing it makes Serve return in every case.
		_ = ln.Close()
		<-done
	})
	return u
}

// Handle replaces the handler.
func (u *Upstream) Handle(h fasthttp.RequestHandler) { u.handler.Store(&h) }

// Paths lists the paths of the requests that reached the handler.
func (u *Upstream) Paths() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.paths...)
}

// Raw sends raw bytes to addr and reads one response. The connection is
// closed afterwards.
func Raw(t testing.TB, addr, raw string) (*http.Response, []byte) {
	t.Helper()
	c := Send(t, addr, raw)
	defer c.Close()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the response to %q: %v", raw, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, body
}

// RawHead sends raw bytes to addr and returns the response head as it came
// off the wire, header names unrecased, ending in the last header's CRLF.
func RawHead(t testing.TB, addr, raw string) string {
	t.Helper()
	c := Send(t, addr, raw)
	defer c.Close()
	var head []byte
	buf := make([]byte, 4096)
	for {
		if i := bytes.Index(head, []byte("\r\n\r\n")); i >= 0 {
			return string(head[:i+2])
		}
		n, err := c.Read(buf)
		head = append(head, buf[:n]...)
		if err != nil {
			t.Fatalf("reading the response head to %q: %v (read %q)", raw, err, head)
		}
	}
}

// Send dials addr and writes raw, with 10 s to finish the exchange; the
// caller closes the connection.
func Send(t testing.TB, addr, raw string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		c.Close()
		t.Fatal(err)
	}
	return c
}

// WaitFor polls cond until it holds or 10 s pass; for conditions produced
// by other goroutines the test cannot otherwise wait on.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// Within receives from ch, failing the test when nothing comes in 10 s.
func Within[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	timeout := time.NewTimer(10 * time.Second) // a failure bound
	defer timeout.Stop()
	select {
	case v := <-ch:
		return v
	case <-timeout.C:
		t.Fatalf("timed out waiting for %s", what)
		var zero T
		return zero
	}
}

// quiet drops fasthttp's log lines (its warning about Request.Body() on a
// streamed body is expected from test handlers).
type quiet struct{}

func (quiet) Printf(string, ...any) {}

// WaitArmed waits for a retry's timer, due delay from now on clk, and then
// checks that attempts() is want: no attempt went before the delay passed.
// Counting timers could not tell it apart: other timers (a janitor's, a
// client watch's) may be armed throughout.
func WaitArmed(t testing.TB, clk *clock.Fake, delay time.Duration, attempts func() int64, want int64) {
	t.Helper()
	WaitFor(t, "retry timer", func() bool { return clk.ArmedFor(delay) })
	if n := attempts(); n != want {
		t.Fatalf("%d attempts before the delay passed, want %d", n, want)
	}
}
