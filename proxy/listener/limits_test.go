package listener

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/metrics"
	"github.com/warden-dev/warden/internal/testkit/fasttest"
	"github.com/warden-dev/warden/policy"
)

func TestDefaultMaxConns(t *testing.T) {
	all := &policy.Policy{Ingress: &policy.Ingress{}, Egress: &policy.Egress{HTTPListen: ":1", GRPCListen: ":2"},
		Bridges: []policy.Bridge{{MaxConnections: 20}, {MaxConnections: 30}}}
	ingressOnly := &policy.Policy{Ingress: &policy.Ingress{}}
	tests := []struct {
		name   string
		p      *policy.Policy
		nofile uint64
		want   int
	}{
		{"one listener", ingressOnly, 1024, (1024 - 256) / 2},
		{"three listeners and two bridges", all, 1024, (1024 - 256 - 2*50) / 2 / 3},
		{"none configured counts as one", &policy.Policy{}, 1024, (1024 - 256) / 2},
		{"a large limit is capped", ingressOnly, 1 << 20, 16384},
		{"an unknown limit", ingressOnly, 0, 16384},
		{"no limit (RLIM_INFINITY)", ingressOnly, ^uint64(0), 16384},
		{"a limit under the reserve still admits one", all, 200, 1},
	}
	for _, tt := range tests {
		if got := DefaultMaxConns(tt.p, tt.nofile); got != tt.want {
			t.Errorf("%s: DefaultMaxConns = %d, want %d", tt.name, got, tt.want)
		}
	}
	if lim := NewLimits(7, policy.ListenerTimeouts{}, all, 1024); lim.MaxConns != 7 {
		t.Errorf("a configured cap became %d", lim.MaxConns)
	}
}

func TestBudgetWarning(t *testing.T) {
	p := func(in, eg int) *policy.Policy {
		return &policy.Policy{Ingress: &policy.Ingress{MaxConnections: in},
			Egress:  &policy.Egress{HTTPListen: ":1", GRPCListen: ":2", MaxConnections: eg},
			Bridges: []policy.Bridge{{MaxConnections: 20}}}
	}
	tests := []struct {
		name   string
		p      *policy.Policy
		nofile uint64
		warn   bool
	}{
		{"defaults fit", p(0, 0), 1024, false},
		{"small caps fit", p(100, 100), 1024, false},
		// 2 × (300 + 2×100) = 1000 leaves 24 of 1024, under 256 + 40.
		{"caps over the limit", p(300, 100), 1024, true},
		{"an unknown limit", p(100000, 100000), 0, false},
	}
	for _, tt := range tests {
		w := BudgetWarning(tt.p, tt.nofile)
		if (w != "") != tt.warn {
			t.Errorf("%s: warning %q, want one: %v", tt.name, w, tt.warn)
		}
	}
}

// TestMaxConns: a connection over the cap is closed before anything is
// read from it and counted; the gauge follows every close exactly once
// (a hijacked connection's included); a reload raises the cap without
// rebinding.
func TestMaxConns(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	h := func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) == "/hijack" {
			ctx.HijackSetNoResponse(true)
			ctx.Hijack(func(net.Conn) { <-release })
		}
	}
	m := metrics.New()
	log := slog.New(slog.DiscardHandler)
	slot := NewSlot("test", clock.Real{}, log, func(addr string, lim Limits) (Server, error) {
		return Start(addr, ProxyServer(h, nil, log), lim, Config{Name: "ingress", Metrics: m, Log: log})
	})
	t.Cleanup(func() { _ = slot.Shutdown(context.Background(), func() error { return nil }) })
	bind := func(max int) {
		t.Helper()
		if err := slot.Bind("127.0.0.1:0", Limits{MaxConns: max}, func() error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	conns := func() float64 { return fasttest.Value(m.ListenerConnections.WithLabelValues("ingress")) }
	refused := func() float64 { return fasttest.Value(m.ListenerRefused.WithLabelValues("ingress")) }
	bind(2)
	addr := slot.Addr()

	tunnel := dial(t, addr)
	tunnel.send(t, "GET /hijack HTTP/1.1\r\nHost: a\r\n\r\n")
	kept := dial(t, addr)
	kept.send(t, getReq)
	if st, _ := kept.response(t); st != 200 {
		t.Fatalf("second connection: %d", st)
	}
	over := dial(t, addr)
	over.closed(t)
	if conns() != 2 || refused() != 1 {
		t.Fatalf("%v connections held, %v refused; want 2 and 1", conns(), refused())
	}

	bind(3) // same address: the cap moves, the socket stays
	if slot.Addr() != addr {
		t.Fatalf("the reload rebound %s to %s", addr, slot.Addr())
	}
	third := dial(t, addr)
	third.send(t, getReq)
	if st, _ := third.response(t); st != 200 {
		t.Fatalf("a connection under the raised cap: %d", st)
	}

	once.Do(func() { close(release) }) // the hijacker returns: fasthttp closes the connection
	tunnel.closed(t)
	fasttest.WaitFor(t, "the hijacked connection to be uncounted", func() bool { return conns() == 2 })
	kept.Close()
	third.Close()
	fasttest.WaitFor(t, "every connection to be uncounted", func() bool { return conns() == 0 })
	// A drain that cuts what is left closes each connection once more.
	late := dial(t, addr)
	late.send(t, getReq)
	late.response(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = slot.Shutdown(ctx, func() error { return nil })
	fasttest.WaitFor(t, "the cut connection to be uncounted", func() bool { return conns() == 0 })
	if n := conns(); n != 0 {
		t.Fatalf("%v connections counted after the drain, want 0", n)
	}
}

// failNext is a listening socket whose next Accept fails with an error no
// server retries.
type failNext struct {
	net.Listener
	mu   sync.Mutex
	fail bool
}

var errBoom = errors.New("boom")

func (f *failNext) Accept() (net.Conn, error) {
	c, err := f.Listener.Accept()
	f.mu.Lock()
	fail := f.fail
	f.fail = false
	f.mu.Unlock()
	if err == nil && fail {
		c.Close()
		return nil, errBoom
	}
	return c, err
}

// TestServerRestarts: a server whose Serve returns while its socket is
// open is started again on it after a backoff, during which the slot is
// not ready, naming the listener.
func TestServerRestarts(t *testing.T) {
	for _, k := range []struct {
		name  string
		start func(s *socket) Server
	}{
		{"fasthttp", func(s *socket) Server {
			return startOn(s, ProxyServer(func(*fasthttp.RequestCtx) {}, nil, slog.New(slog.DiscardHandler)))
		}},
		{"net/http", func(s *socket) Server {
			return startHTTPOn(s, &http.Server{Handler: http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})})
		}},
	} {
		t.Run(k.name, func(t *testing.T) {
			clk := clock.NewFake(time.Unix(1_700_000_000, 0))
			m := metrics.New()
			var sock *failNext
			slot := NewSlot("test", clk, slog.New(slog.DiscardHandler), func(addr string, lim Limits) (Server, error) {
				raw, err := net.Listen("tcp", addr)
				if err != nil {
					return nil, err
				}
				sock = &failNext{Listener: raw}
				return k.start(newSocket(sock, k.name == "fasthttp", lim, Config{Name: "egress", Metrics: m, Clock: clk})), nil
			})
			t.Cleanup(func() { _ = slot.Shutdown(context.Background(), func() error { return nil }) })
			if err := slot.Bind("127.0.0.1:0", Limits{}, func() error { return nil }); err != nil {
				t.Fatal(err)
			}
			addr := slot.Addr()
			mustServe(t, addr)

			sock.mu.Lock()
			sock.fail = true
			sock.mu.Unlock()
			c := dial(t, addr) // accepted, then failed: Serve returns
			c.closed(t)
			fasttest.WaitFor(t, "the restart's backoff", func() bool { return clk.ArmedFor(5 * time.Millisecond) })
			err := slot.Ready(true)
			if err == nil || !strings.Contains(err.Error(), "listener "+addr+" not accepting") || !strings.Contains(err.Error(), "boom") {
				t.Fatalf("Ready while the server restarts: %v", err)
			}
			if n := fasttest.Value(m.ListenerRestarts.WithLabelValues("egress")); n != 1 {
				t.Fatalf("%v restarts counted, want 1", n)
			}
			clk.Advance(5 * time.Millisecond)
			mustServe(t, addr)
			if err := slot.Ready(true); err != nil {
				t.Fatalf("Ready after the restart: %v", err)
			}
		})
	}
}
