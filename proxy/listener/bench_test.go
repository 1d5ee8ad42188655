package listener

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warden-dev/warden/governor/metrics"
	"github.com/warden-dev/warden/internal/rawio"
	"github.com/warden-dev/warden/policy"
)

var benchTimeouts = policy.ListenerTimeouts{Header: time.Minute, BodyIdle: time.Minute, Idle: 90 * time.Second}

// BenchmarkRequestCycle is the read-deadline work of one request on a
// keep-alive connection: the listener's (first byte, end of the head,
// response out), against the three deadlines fasthttp set itself before
// (its idle, read and HeaderReceived timeouts), on the same raw
// connection with lazy deadlines.
func BenchmarkRequestCycle(b *testing.B) {
	b.Run("listener", func(b *testing.B) {
		c := newConn(benchConn(b), &gate{m: newGateMetrics(metrics.New(), "bench")}, benchTimeouts)
		b.ReportAllocs()
		for b.Loop() {
			c.active()
			_ = c.SetReadDeadline(time.Now()) // HeaderReceived's
			c.idle()
		}
	})
	b.Run("fasthttp-timeouts", func(b *testing.B) {
		c := benchConn(b)
		b.ReportAllocs()
		for b.Loop() {
			_ = c.SetReadDeadline(time.Now().Add(90 * time.Second))
			_ = c.SetReadDeadline(time.Now().Add(time.Minute))
			_ = c.SetReadDeadline(time.Now().Add(24 * time.Hour))
		}
	})
}

// benchConn is the server side of a loopback connection, wrapped as the
// listener wraps what it accepts.
func benchConn(b *testing.B) net.Conn {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	cl, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cl.Close() })
	sc, err := ln.Accept()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { sc.Close() })
	return rawio.WrapLazy(sc)
}

// BenchmarkKeepAlive serves GETs one after the other on one keep-alive
// loopback connection: through Start (the gate and conn), and through a
// bare fasthttp server on rawio.Listener with fasthttp's own timeouts, as
// before. The difference is the listener's per-request cost.
func BenchmarkKeepAlive(b *testing.B) {
	h := func(ctx *fasthttp.RequestCtx) { ctx.WriteString("ok") }
	log := slog.New(slog.DiscardHandler)
	b.Run("listener", func(b *testing.B) {
		l, err := Start("127.0.0.1:0", ProxyServer(h, nil, log), Limits{MaxConns: 100, Timeouts: benchTimeouts}, Config{Name: "bench", Log: log})
		if err != nil {
			b.Fatal(err)
		}
		defer l.Shutdown(b.Context())
		keepAlive(b, l.Addr().String())
	})
	b.Run("bare", func(b *testing.B) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		srv := ProxyServer(h, nil, log)
		srv.ReadTimeout, srv.IdleTimeout = time.Minute, 90*time.Second
		srv.HeaderReceived = func(*fasthttp.RequestHeader) fasthttp.RequestConfig {
			return fasthttp.RequestConfig{ReadTimeout: 24 * time.Hour}
		}
		done := make(chan struct{})
		go func() { defer close(done); _ = srv.Serve(rawio.Listener(ln)) }()
		defer func() { _ = srv.Shutdown(); <-done }()
		keepAlive(b, ln.Addr().String())
	})
}

func keepAlive(b *testing.B, addr string) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	req := []byte("GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	const resp = len("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	br := bufio.NewReader(c)
	buf := make([]byte, resp)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Write(req); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(br, buf); err != nil {
			b.Fatal(err)
		}
	}
}
