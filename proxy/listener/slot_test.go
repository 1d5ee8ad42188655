package listener

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/goleak"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/internal/testkit/fasttest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, fasttest.LeakOptions()...) }

// Two addresses that differ as configured, so a Bind from one to the
// other moves the listener.
const (
	addrA = "127.0.0.1:0"
	addrB = "localhost:0"
)

// holder answers 200, except that requests to /hold wait for release.
type holder struct {
	entered chan struct{} // one value per /hold request that has arrived
	release chan struct{}
	once    sync.Once
}

func (h *holder) wait(path string) {
	if path == "/hold" {
		h.entered <- struct{}{}
		<-h.release
	}
}

func (h *holder) free() { h.once.Do(func() { close(h.release) }) }

// tracked records when a started server's Shutdown has returned.
type tracked struct {
	Server
	shut chan struct{}
	err  error // Shutdown's result, set before shut is closed
}

func (s *tracked) Shutdown(ctx context.Context) error {
	s.err = s.Server.Shutdown(ctx)
	close(s.shut)
	return s.err
}

// kinds are the two servers a slot holds in warden.
var kinds = []struct {
	name  string
	start func(h *holder, log *slog.Logger) StartFunc
}{
	{"fasthttp", func(h *holder, log *slog.Logger) StartFunc {
		handler := func(ctx *fasthttp.RequestCtx) { h.wait(string(ctx.Path())) }
		return func(addr string, lim Limits) (Server, error) {
			return Start(addr, ProxyServer(handler, nil, log), lim, Config{Name: "test", Log: log})
		}
	}},
	{"net/http", func(h *holder, log *slog.Logger) StartFunc {
		handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h.wait(r.URL.Path) })
		return func(addr string, lim Limits) (Server, error) {
			return StartHTTP(addr, &http.Server{Handler: handler}, lim, Config{Name: "test", Log: log})
		}
	}},
}

type fixture struct {
	clk  *clock.Fake
	hold *holder
	slot *Slot

	mu       sync.Mutex
	started  []*tracked
	builds   int
	releases []bool // per release call: whether every server was shut by then
}

func newFixture(t *testing.T, start func(*holder, *slog.Logger) StartFunc) *fixture {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	f := &fixture{clk: clock.NewFake(time.Unix(1_700_000_000, 0)), hold: &holder{entered: make(chan struct{}, 4), release: make(chan struct{})}}
	inner := start(f.hold, log)
	f.slot = NewSlot("test", f.clk, log, func(addr string, lim Limits) (Server, error) {
		srv, err := inner(addr, lim)
		if err != nil {
			return nil, err
		}
		s := &tracked{Server: srv, shut: make(chan struct{})}
		f.mu.Lock()
		f.started = append(f.started, s)
		f.mu.Unlock()
		return s, nil
	})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		f.slot.Shutdown(ctx, f.release(nil))
	})
	t.Cleanup(f.hold.free) // runs first: nothing stays held
	return f
}

// server returns the i-th server the slot started.
func (f *fixture) server(t *testing.T, i int) *tracked {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if i >= len(f.started) {
		t.Fatalf("the slot started %d servers, want more than %d", len(f.started), i)
	}
	return f.started[i]
}

func (f *fixture) starts() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.started)
}

// bind binds addr with a build that succeeds.
func (f *fixture) bind(t *testing.T, addr string) {
	t.Helper()
	if err := f.slot.Bind(addr, Limits{}, f.build(nil)); err != nil {
		t.Fatalf("bind %s: %v", addr, err)
	}
}

// release returns a Shutdown release that records its call and fails with
// err.
func (f *fixture) release(err error) func() error {
	return func() error {
		f.mu.Lock()
		defer f.mu.Unlock()
		all := true
		for _, s := range f.started {
			all = all && isShut(s)
		}
		f.releases = append(f.releases, all)
		return err
	}
}

// build returns a build that counts its calls and fails with err.
func (f *fixture) build(err error) func() error {
	return func() error { f.builds++; return err }
}

// hold sends a /hold request to addr and returns once the handler has it.
func (f *fixture) holdOn(addr string) <-chan result {
	res := make(chan result, 1)
	go func() { st, err := get(addr, "/hold"); res <- result{st, err} }()
	<-f.hold.entered
	return res
}

type result struct {
	status int
	err    error
}

// get sends one request on a fresh connection and returns the status.
func get(addr, path string) (int, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n", path); err != nil {
		return 0, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, err
}

func mustServe(t *testing.T, addr string) {
	t.Helper()
	if st, err := get(addr, "/"); err != nil || st != 200 {
		t.Fatalf("GET on %s: %d %v", addr, st, err)
	}
}

func waitShut(t *testing.T, s *tracked) {
	t.Helper()
	within(t, s.shut, "the server's shutdown")
}

func isShut(s *tracked) bool {
	select {
	case <-s.shut:
		return true
	default:
		return false
	}
}

// within is fasttest.Within.
func within[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	return fasttest.Within(t, ch, what)
}

func TestSlot(t *testing.T) {
	cases := []struct {
		name string
		run  func(t *testing.T, f *fixture)
	}{
		{"first bind serves", func(t *testing.T, f *fixture) {
			if f.slot.Addr() != "" || f.slot.Ready(true) == nil || f.slot.Err() != nil {
				t.Fatal("an empty slot reports an address, readiness or shutdown")
			}
			f.bind(t, addrA)
			if f.slot.Addr() == "" || f.builds != 1 || f.starts() != 1 {
				t.Fatalf("addr %q, %d builds, %d starts", f.slot.Addr(), f.builds, f.starts())
			}
			if err := f.slot.Ready(true); err != nil {
				t.Fatal(err)
			}
			mustServe(t, f.slot.Addr())
		}},
		{"same address keeps the listener", func(t *testing.T, f *fixture) {
			f.bind(t, addrA)
			addr := f.slot.Addr()
			f.bind(t, addrA)
			if f.slot.Addr() != addr || f.starts() != 1 || f.builds != 2 {
				t.Fatalf("addr %q (was %q), %d starts, %d builds", f.slot.Addr(), addr, f.starts(), f.builds)
			}
			mustServe(t, addr)
		}},
		{"moved address drains the old one", func(t *testing.T, f *fixture) {
			f.bind(t, addrA)
			old := f.slot.Addr()
			held := f.holdOn(old)
			f.bind(t, addrB)
			if f.slot.Addr() == old || f.starts() != 2 {
				t.Fatalf("addr %q (was %q), %d starts", f.slot.Addr(), old, f.starts())
			}
			mustServe(t, f.slot.Addr())
			if isShut(f.server(t, 0)) {
				t.Fatal("the old listener was shut with a request in flight")
			}
			f.hold.free()
			if r := within(t, held, "the held request"); r.err != nil || r.status != 200 {
				t.Fatalf("the request in flight on the old listener: %+v", r)
			}
			waitShut(t, f.server(t, 0))
			if err := f.server(t, 0).err; err != nil {
				t.Fatalf("the old listener drained with %v", err)
			}
			if _, err := get(old, "/"); err == nil {
				t.Fatal("the old address still accepts")
			}
		}},
		{"bind failure leaves the old one serving", func(t *testing.T, f *fixture) {
			f.bind(t, addrA)
			addr := f.slot.Addr()
			taken, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer taken.Close()
			err = f.slot.Bind(taken.Addr().String(), Limits{}, f.build(nil))
			// The caller names the component (the app's "egress: "), so
			// the slot does not.
			if err == nil || !strings.HasPrefix(err.Error(), "listen on "+taken.Addr().String()+": ") {
				t.Fatalf("bind onto a taken address: %v", err)
			}
			if f.builds != 1 {
				t.Fatal("build ran although the address could not be bound")
			}
			if f.slot.Addr() != addr || isShut(f.server(t, 0)) {
				t.Fatal("the failed bind replaced the listener")
			}
			mustServe(t, addr)
		}},
		{"build failure drains the new one", func(t *testing.T, f *fixture) {
			f.bind(t, addrA)
			addr := f.slot.Addr()
			bad := errors.New("bad policy")
			if err := f.slot.Bind(addrB, Limits{}, f.build(bad)); !errors.Is(err, bad) {
				t.Fatalf("bind with a failing build: %v", err)
			}
			if f.slot.Addr() != addr || f.starts() != 2 {
				t.Fatalf("addr %q (was %q), %d starts", f.slot.Addr(), addr, f.starts())
			}
			waitShut(t, f.server(t, 1))
			if isShut(f.server(t, 0)) {
				t.Fatal("the current listener was shut")
			}
			mustServe(t, addr)
		}},
		{"stop empties the slot", func(t *testing.T, f *fixture) {
			f.bind(t, addrA)
			if err := f.slot.Stop(context.Background()); err != nil {
				t.Fatal(err)
			}
			if !isShut(f.server(t, 0)) || f.slot.Addr() != "" {
				t.Fatal("Stop left the listener")
			}
			if f.slot.Ready(true) == nil || f.slot.Ready(false) != nil {
				t.Fatal("Ready ignores the stopped listener or the configuration")
			}
			f.bind(t, addrA)
			if f.starts() != 2 || f.slot.Addr() == "" {
				t.Fatal("a bind after Stop did not start a listener")
			}
		}},
		{"retire drains in the background", func(t *testing.T, f *fixture) {
			f.bind(t, addrA)
			addr := f.slot.Addr()
			held := f.holdOn(addr)
			f.slot.Retire() // returns with a request in flight
			if f.slot.Addr() != "" || isShut(f.server(t, 0)) {
				t.Fatal("Retire left the listener current or cut its request")
			}
			f.hold.free()
			if r := within(t, held, "the held request"); r.err != nil || r.status != 200 {
				t.Fatalf("the request in flight on the retired listener: %+v", r)
			}
			waitShut(t, f.server(t, 0))
			if _, err := get(addr, "/"); err == nil {
				t.Fatal("the retired address still accepts")
			}
			f.slot.Retire() // empty: nothing to do
			f.bind(t, addrA)
			if f.starts() != 2 || f.slot.Addr() == "" {
				t.Fatal("a bind after Retire did not start a listener")
			}
		}},
		{"grace cuts a replaced listener", func(t *testing.T, f *fixture) {
			f.bind(t, addrA)
			held := f.holdOn(f.slot.Addr())
			f.bind(t, addrB)
			fasttest.WaitFor(t, "the drain's grace timer", func() bool { return f.clk.Timers() == 1 })
			f.clk.Advance(DrainGrace - time.Nanosecond)
			if f.clk.Timers() != 1 || isShut(f.server(t, 0)) {
				t.Fatal("the drain ended before its grace")
			}
			f.clk.Advance(time.Nanosecond)
			if r := within(t, held, "the held request"); r.err == nil {
				t.Fatalf("the straggler was not cut: %+v", r)
			}
			waitShut(t, f.server(t, 0))
			if f.server(t, 0).err == nil {
				t.Fatal("a cut drain reported no error")
			}
			mustServe(t, f.slot.Addr())
		}},
		{"StopAccepting refuses new connections, serves accepted ones", func(t *testing.T, f *fixture) {
			f.bind(t, addrA)
			addr := f.slot.Addr()
			held := f.holdOn(addr)
			f.slot.StopAccepting()
			if c, err := net.DialTimeout("tcp", addr, 5*time.Second); err == nil {
				c.Close()
				t.Fatal("the listener accepts after StopAccepting")
			}
			if isShut(f.server(t, 0)) {
				t.Fatal("StopAccepting shut the server down")
			}
			if err := f.slot.Bind(addrB, Limits{}, f.build(nil)); err == nil || f.starts() != 1 {
				t.Fatalf("a bind after StopAccepting: %v, %d starts", err, f.starts())
			}
			f.hold.free()
			if r := within(t, held, "the held request"); r.err != nil || r.status != 200 {
				t.Fatalf("the request in flight at StopAccepting: %+v", r)
			}
			if err := f.slot.Shutdown(context.Background(), f.release(nil)); err != nil {
				t.Fatalf("Shutdown after StopAccepting: %v", err)
			}
			if !isShut(f.server(t, 0)) || len(f.releases) != 1 {
				t.Fatalf("Shutdown after StopAccepting: shut %v, %d releases", isShut(f.server(t, 0)), len(f.releases))
			}
		}},
		{"Addr answers during the drain", func(t *testing.T, f *fixture) {
			f.bind(t, addrA)
			held := f.holdOn(f.slot.Addr())
			done := make(chan error, 1)
			go func() { done <- f.slot.Shutdown(context.Background(), f.release(nil)) }()
			// Shutdown empties the slot before it drains: once Addr is
			// "", the drain is under way, and Addr did not wait for it.
			// (Addr runs apart so that one blocked by the drain fails the
			// test instead of hanging it.)
			empty := make(chan struct{})
			go func() {
				defer close(empty)
				for f.slot.Addr() != "" {
					time.Sleep(time.Millisecond)
				}
			}()
			within(t, empty, `Addr to answer "" during the drain`)
			if f.slot.Err() == nil || f.slot.Ready(true) == nil {
				t.Fatal("a draining slot reports neither shutdown nor unreadiness")
			}
			select {
			case err := <-done:
				t.Fatalf("Shutdown returned with a request in flight: %v", err)
			default:
			}
			f.hold.free()
			if r := within(t, held, "the held request"); r.err != nil || r.status != 200 {
				t.Fatalf("the drained request: %+v", r)
			}
			if err := within(t, done, "Shutdown"); err != nil {
				t.Fatal(err)
			}
		}},
		{"Shutdown waits for background drains", func(t *testing.T, f *fixture) {
			f.bind(t, addrA)
			held := f.holdOn(f.slot.Addr())
			f.bind(t, addrB)
			done := make(chan error, 1)
			go func() { done <- f.slot.Shutdown(context.Background(), f.release(nil)) }()
			waitShut(t, f.server(t, 1))
			f.hold.free()
			if err := within(t, done, "Shutdown"); err != nil {
				t.Fatal(err)
			}
			if !isShut(f.server(t, 0)) {
				t.Fatal("Shutdown returned before the replaced listener drained")
			}
			if len(f.releases) != 1 || !f.releases[0] {
				t.Fatalf("release ran %d times, after the drains: %v", len(f.releases), f.releases)
			}
			if r := within(t, held, "the held request"); r.err != nil || r.status != 200 {
				t.Fatalf("the drained request: %+v", r)
			}
		}},
		{"Shutdown cuts background drains at its deadline", func(t *testing.T, f *fixture) {
			f.bind(t, addrA)
			held := f.holdOn(f.slot.Addr())
			f.bind(t, addrB)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			released := errors.New("release failed")
			go func() { done <- f.slot.Shutdown(ctx, f.release(released)) }()
			waitShut(t, f.server(t, 1))
			cancel()
			if r := within(t, held, "the held request"); r.err == nil {
				t.Fatalf("the straggler was not cut: %+v", r)
			}
			if err := within(t, done, "Shutdown"); !errors.Is(err, released) {
				t.Fatalf("Shutdown with an idle current listener and a failing release: %v", err)
			}
			if !isShut(f.server(t, 0)) || f.server(t, 0).err == nil {
				t.Fatal("the replaced listener was not cut")
			}
			if err := f.slot.Bind(addrA, Limits{}, f.build(nil)); err == nil || f.slot.Err() == nil || f.starts() != 2 {
				t.Fatalf("a bind after Shutdown: %v, %d starts", err, f.starts())
			}
			if err := f.slot.Shutdown(context.Background(), f.release(nil)); err != nil || len(f.releases) != 1 {
				t.Fatalf("a second Shutdown: %v, %d releases", err, len(f.releases))
			}
		}},
	}
	for _, k := range kinds {
		for _, c := range cases {
			t.Run(k.name+"/"+c.name, func(t *testing.T) { c.run(t, newFixture(t, k.start)) })
		}
	}
}

// TestProxyServerAddsNoServerHeader: a response passed on without a Server
// header goes out without one.
func TestProxyServerAddsNoServerHeader(t *testing.T) {
	addr := serveProxy(t, func(ctx *fasthttp.RequestCtx) { ctx.WriteString("ok") }, nil)
	head := fasttest.RawHead(t, addr, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	if strings.Contains(strings.ToLower(head), "\nserver:") {
		t.Fatalf("a Server header was added:\n%s", head)
	}
}

// A request fasthttp cannot parse is refused without quoting it: the
// answer (and the debug log) would otherwise carry the client's head,
// credentials included.
func TestParseErrorQuotesNoRequest(t *testing.T) {
	addr := serveProxy(t, func(ctx *fasthttp.RequestCtx) { ctx.WriteString("ok") }, nil)
	resp, body := fasttest.Raw(t, addr,
		"POST / HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer S3CRET\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab")
	if resp.StatusCode != 400 || strings.Contains(string(body), "S3CRET") {
		t.Fatalf("%d %s: want 400 without the request's bytes", resp.StatusCode, body)
	}
}

// serveProxy serves h with a ProxyServer on a loopback port until the test
// ends, and returns its address; adjust, if set, changes the server first.
func serveProxy(t *testing.T, h fasthttp.RequestHandler, adjust func(*fasthttp.Server)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := ProxyServer(h, nil, slog.New(slog.DiscardHandler))
	if adjust != nil {
		adjust(s)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Serve(ln) }()
	t.Cleanup(func() { _ = s.Shutdown(); _ = ln.Close(); <-done })
	return ln.Addr().String()
}
