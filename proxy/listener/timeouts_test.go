package listener

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/net/http2"

	"github.com/warden-dev/warden/governor/metrics"
	"github.com/warden-dev/warden/internal/testkit/fasttest"
	"github.com/warden-dev/warden/policy"
)

// serveLimited serves h with a ProxyServer under lim until the test ends.
func serveLimited(t *testing.T, h fasthttp.RequestHandler, lim Limits) (*Listener, *metrics.Metrics) {
	t.Helper()
	m := metrics.New()
	log := slog.New(slog.DiscardHandler)
	l, err := Start("127.0.0.1:0", ProxyServer(h, nil, log), lim, Config{Name: "ingress", Metrics: m, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shutdown(t, l) })
	return l, m
}

func shutdown(t *testing.T, s Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = s.Shutdown(ctx)
}

// echo answers 200 with the request's body; a body that stalls for
// body_idle gets 408, one cut by another deadline 504.
func echo(ctx *fasthttp.RequestCtx) {
	if !ctx.Request.IsBodyStream() {
		ctx.Write(ctx.Request.Body())
		return
	}
	b, err := io.ReadAll(ctx.RequestBodyStream())
	switch {
	case errors.Is(err, ErrBodyIdle):
		ctx.SetStatusCode(fasthttp.StatusRequestTimeout)
		ctx.SetConnectionClose()
	case errors.Is(err, os.ErrDeadlineExceeded):
		ctx.SetStatusCode(fasthttp.StatusGatewayTimeout)
		ctx.SetConnectionClose()
	case err != nil:
		ctx.Error(err.Error(), fasthttp.StatusBadRequest)
	default:
		ctx.Write(b)
	}
}

// client is a raw connection to a listener, every wait on it bounded.
type client struct {
	net.Conn
	br *bufio.Reader
}

func dial(t *testing.T, addr string) *client {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second)) // a failure bound
	return &client{Conn: c, br: bufio.NewReader(c)}
}

func (c *client) send(t *testing.T, s string) {
	t.Helper()
	if _, err := io.WriteString(c, s); err != nil {
		t.Fatal(err)
	}
}

// response reads the next response whole.
func (c *client) response(t *testing.T) (int, string) {
	t.Helper()
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		t.Fatalf("reading a response: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b)
}

// closed waits for the server to close the connection: the read ends
// with EOF (or a reset), not with the failure bound.
func (c *client) closed(t *testing.T) {
	t.Helper()
	_, err := io.Copy(io.Discard, c.br)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("the connection stayed open")
	}
}

const getReq = "GET / HTTP/1.1\r\nHost: a\r\n\r\n"

// timesOut sends raw and expects a 408 no sooner than after, and then the
// connection's close.
func timesOut(raw string, after time.Duration) func(t *testing.T, addr string) {
	return func(t *testing.T, addr string) {
		c := dial(t, addr)
		c.send(t, raw)
		start := time.Now()
		if st, _ := c.response(t); st != 408 {
			t.Fatalf("%q: %d, want 408", raw, st)
		}
		if waited := time.Since(start); waited < after*9/10 {
			t.Fatalf("408 after %v, before the timeout", waited)
		}
		c.closed(t)
	}
}

func timeoutsOf(m *metrics.Metrics, listener, reason string) float64 {
	return fasttest.Value(m.ListenerTimeouts.WithLabelValues(listener, reason))
}

func TestFasthttpTimeouts(t *testing.T) {
	const short = 150 * time.Millisecond
	tests := []struct {
		name   string
		to     policy.ListenerTimeouts
		run    func(t *testing.T, addr string)
		reason string // the timeout counted, once ("": none)
	}{
		{"a stalled head gets 408", policy.ListenerTimeouts{Header: short, BodyIdle: time.Minute, Idle: time.Minute},
			timesOut("GET / HTTP/1.1\r\nHost: a\r\n", short), "header"},
		{"a connection that sends nothing is closed", policy.ListenerTimeouts{Header: short, BodyIdle: time.Minute, Idle: time.Minute},
			func(t *testing.T, addr string) { dial(t, addr).closed(t) }, "header"},
		{"a later head is timed from its first byte", policy.ListenerTimeouts{Header: short, BodyIdle: time.Minute, Idle: time.Minute},
			func(t *testing.T, addr string) {
				c := dial(t, addr)
				c.send(t, getReq)
				if st, _ := c.response(t); st != 200 {
					t.Fatalf("first request: %d", st)
				}
				time.Sleep(2 * short) // idle, longer than the header timeout: not counted against the next head
				c.send(t, "GET / HTTP/1.1\r\n")
				start := time.Now()
				if st, _ := c.response(t); st != 408 {
					t.Fatalf("stalled second head: %d, want 408", st)
				}
				if waited := time.Since(start); waited < short*9/10 {
					t.Fatalf("408 after %v, before the header timeout", waited)
				}
			}, "header"},
		{"a body slower than the header timeout passes", policy.ListenerTimeouts{Header: short, BodyIdle: 10 * short, Idle: time.Minute},
			func(t *testing.T, addr string) {
				c := dial(t, addr)
				c.send(t, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n\r\nab")
				time.Sleep(2 * short) // the body dawdles past the header timeout
				c.send(t, "cd")
				if st, body := c.response(t); st != 200 || body != "abcd" {
					t.Fatalf("slow body: %d %q, want 200 abcd", st, body)
				}
			}, ""},
		{"a body that stalls is cut after body_idle", policy.ListenerTimeouts{Header: time.Minute, BodyIdle: short, Idle: time.Minute},
			timesOut("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4096\r\n\r\n0123456789", short), "body_idle"},
		// fasthttp reads a body's first byte itself, before the handler.
		{"a body that never begins is cut after body_idle", policy.ListenerTimeouts{Header: time.Minute, BodyIdle: short, Idle: time.Minute},
			timesOut("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4096\r\n\r\n", short), "body_idle"},
		{"a body that keeps moving is not cut", policy.ListenerTimeouts{Header: time.Minute, BodyIdle: 2 * short, Idle: time.Minute},
			func(t *testing.T, addr string) {
				c := dial(t, addr)
				c.send(t, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 6\r\n\r\n")
				for _, b := range []string{"a", "b", "c", "d", "e", "f"} {
					time.Sleep(short / 2) // gaps under body_idle, adding up to more
					c.send(t, b)
				}
				if st, body := c.response(t); st != 200 || body != "abcdef" {
					t.Fatalf("trickled body: %d %q, want 200 abcdef", st, body)
				}
			}, ""},
		{"an idle keep-alive connection is closed", policy.ListenerTimeouts{Header: time.Minute, BodyIdle: time.Minute, Idle: short},
			func(t *testing.T, addr string) {
				c := dial(t, addr)
				c.send(t, getReq)
				if st, _ := c.response(t); st != 200 {
					t.Fatalf("request: %d", st)
				}
				start := time.Now()
				c.closed(t)
				if waited := time.Since(start); waited < short*9/10 {
					t.Fatalf("closed after %v, before the idle timeout", waited)
				}
			}, "idle"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, m := serveLimited(t, echo, Limits{Timeouts: tt.to})
			tt.run(t, l.Addr().String())
			for _, reason := range []string{"header", "body_idle", "idle"} {
				want := 0.0
				if reason == tt.reason {
					want = 1
				}
				if n := timeoutsOf(m, "ingress", reason); n != want {
					t.Errorf("%s timeouts counted: %v, want %v", reason, n, want)
				}
			}
		})
	}
}

// A deadline the handler sets (a target's timeout) bounds the body's reads
// too: sooner than body_idle, it is the one that passes, and it is the
// handler's timeout, not the listener's.
func TestHandlerDeadlineBeforeBodyIdle(t *testing.T) {
	const d = 150 * time.Millisecond
	h := func(ctx *fasthttp.RequestCtx) {
		_ = ctx.SetReadDeadline(time.Now().Add(d))
		echo(ctx)
	}
	l, m := serveLimited(t, h, Limits{Timeouts: policy.ListenerTimeouts{Header: time.Minute, BodyIdle: time.Minute, Idle: time.Minute}})
	c := dial(t, l.Addr().String())
	c.send(t, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4096\r\n\r\n0123456789")
	if st, _ := c.response(t); st != 504 {
		t.Fatalf("body cut by the handler's deadline: %d, want 504 (a timeout that is not ErrBodyIdle)", st)
	}
	if n := timeoutsOf(m, "ingress", "body_idle"); n != 0 {
		t.Fatalf("body_idle counted %v times for the handler's deadline", n)
	}
}

// A hijacked connection (a tunnel, a WebSocket) is the hijacker's: no
// listener timeout runs on it, however long it stays quiet.
func TestHijackedConnectionKeepsNoTimeout(t *testing.T) {
	const short = 100 * time.Millisecond
	h := func(ctx *fasthttp.RequestCtx) {
		ctx.HijackSetNoResponse(true)
		ctx.Hijack(func(c net.Conn) {
			_ = c.SetDeadline(time.Time{}) // as splice.Set.Hijack does
			buf := make([]byte, 4)
			if _, err := io.ReadFull(c, buf); err == nil {
				_, _ = c.Write(buf)
			}
		})
	}
	l, m := serveLimited(t, h, Limits{Timeouts: policy.ListenerTimeouts{Header: short, BodyIdle: short, Idle: short}})
	c := dial(t, l.Addr().String())
	c.send(t, "GET /tunnel HTTP/1.1\r\nHost: a\r\n\r\n")
	time.Sleep(4 * short) // quiet past every timeout: the tunnel's pace, not a wait
	c.send(t, "ping")
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c.br, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("the quiet tunnel: %q %v, want its echo", buf, err)
	}
	for _, reason := range []string{"header", "body_idle", "idle"} {
		if n := timeoutsOf(m, "ingress", reason); n != 0 {
			t.Fatalf("%s timeouts counted on a tunnel: %v", reason, n)
		}
	}
}

// The gRPC egress's net/http listener: the HTTP/2 preface must come within
// header; a connection idle (no stream) for idle is closed.
func TestHTTP2Timeouts(t *testing.T) {
	const short = 150 * time.Millisecond
	tests := []struct {
		name   string
		run    func(t *testing.T, c *client)
		reason string
	}{
		{"a preface that does not come closes the connection", func(t *testing.T, c *client) { c.closed(t) }, "header"},
		{"an idle connection is closed", func(t *testing.T, c *client) {
			c.send(t, http2.ClientPreface)
			fr := http2.NewFramer(c, c.br)
			if err := fr.WriteSettings(); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			for {
				if _, err := fr.ReadFrame(); err != nil {
					var ne net.Error
					if errors.As(err, &ne) && ne.Timeout() {
						t.Fatal("the idle connection stayed open")
					}
					break
				}
			}
			if waited := time.Since(start); waited < short*9/10 {
				t.Fatalf("closed after %v, before the idle timeout", waited)
			}
		}, "idle"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := metrics.New()
			var protos http.Protocols
			protos.SetUnencryptedHTTP2(true)
			srv := &http.Server{Handler: http.NotFoundHandler(), Protocols: &protos}
			lim := Limits{Timeouts: policy.ListenerTimeouts{Header: short, BodyIdle: time.Minute, Idle: short}}
			h, err := StartHTTP("127.0.0.1:0", srv, lim, Config{Name: "grpc", Metrics: m})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { shutdown(t, h) })
			tt.run(t, dial(t, h.Addr().String()))
			if n := timeoutsOf(m, "grpc", tt.reason); n != 1 {
				t.Fatalf("%s timeouts counted: %v, want 1", tt.reason, n)
			}
			fasttest.WaitFor(t, "the connection to be uncounted", func() bool {
				return fasttest.Value(m.ListenerConnections.WithLabelValues("grpc")) == 0
			})
		})
	}
}

func TestTimeoutsFollowSetLimits(t *testing.T) {
	l, _ := serveLimited(t, echo, Limits{Timeouts: policy.ListenerTimeouts{Header: time.Minute, BodyIdle: time.Minute, Idle: time.Minute}})
	held := dial(t, l.Addr().String()) // accepted under the first limits
	held.send(t, getReq)
	if st, _ := held.response(t); st != 200 {
		t.Fatalf("request: %d", st)
	}
	const short = 100 * time.Millisecond
	l.SetLimits(Limits{Timeouts: policy.ListenerTimeouts{Header: time.Minute, BodyIdle: time.Minute, Idle: short}})
	c := dial(t, l.Addr().String())
	c.send(t, getReq)
	if st, _ := c.response(t); st != 200 {
		t.Fatalf("request: %d", st)
	}
	c.closed(t) // the new idle timeout
	held.send(t, getReq)
	if st, _ := held.response(t); st != 200 {
		t.Fatalf("the connection accepted before the change: %d", st)
	}
}
