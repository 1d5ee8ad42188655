package connpool

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/goleak"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/internal/rawio"
	"github.com/warden-dev/warden/internal/testkit/fasttest"
	"github.com/warden-dev/warden/internal/testkit/loopback"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, fasttest.LeakOptions()...) }

// upstream is a fasthttp server on loopback that counts connections.
type upstream struct {
	addr    string
	srv     *fasthttp.Server
	opened  atomic.Int64
	closed  atomic.Int64
	handler atomic.Pointer[fasthttp.RequestHandler]
}

func startUpstream(t *testing.T, h fasthttp.RequestHandler) *upstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{addr: ln.Addr().String()}
	u.handler.Store(&h)
	u.srv = &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) { (*u.handler.Load())(ctx) },
		ConnState: func(_ net.Conn, st fasthttp.ConnState) {
			switch st {
			case fasthttp.StateNew:
				u.opened.Add(1)
			case fasthttp.StateClosed:
				u.closed.Add(1)
			}
		},
		StreamRequestBody: true,
		CloseOnShutdown:   true,
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = u.srv.Serve(ln) }()
	t.Cleanup(func() {
		_ = u.srv.Shutdown()
		_ = ln.Close() // in case Serve had not registered it (see fasttest.StartUpstream)
		<-done
	})
	return u
}

func newSet(t *testing.T, clk clock.Clock) *Set {
	t.Helper()
	s := NewSet(clk, time.Second)
	t.Cleanup(s.Close)
	return s
}

func getRequest(host, uri string) *fasthttp.RequestHeader {
	var h fasthttp.RequestHeader
	h.SetMethod("GET")
	h.SetRequestURI(uri)
	h.SetHost(host)
	return &h
}

type finish struct {
	once sync.Once
	done chan error
}

func newFinish() *finish { return &finish{done: make(chan error, 1)} }

func (f *finish) Finish(err error) { f.once.Do(func() { f.done <- err }) }

// exchange sends req through p and returns the status and the whole body,
// draining and closing a streamed body like fasthttp's server would.
func exchange(t *testing.T, p *Pool, req *Request) (int, []byte, error) {
	t.Helper()
	var resp fasthttp.Response
	fin := newFinish()
	streamed, err := p.Do(req, &resp, fin)
	if err != nil {
		return 0, nil, err
	}
	if !streamed {
		return resp.StatusCode(), append([]byte(nil), resp.Body()...), nil
	}
	body, rerr := io.ReadAll(resp.BodyStream())
	_ = resp.CloseBodyStream()
	if ferr := <-fin.done; ferr != nil && rerr == nil {
		rerr = ferr
	}
	return resp.StatusCode(), body, rerr
}

func TestBodiesAndReuse(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789abcdef"), 10000) // 160 KB: streamed
	u := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		switch string(ctx.Path()) {
		case "/small":
			ctx.SetBodyString("small")
		case "/big":
			ctx.SetBody(big)
		case "/chunked":
			ctx.SetBodyStream(bytes.NewReader(big), -1)
		case "/empty":
			ctx.SetStatusCode(fasthttp.StatusNoContent)
		}
	})
	p := newSet(t, clock.Real{}).Pool("t", Config{Addr: u.addr})
	for _, path := range []string{"/small", "/big", "/chunked", "/small", "/empty", "/big"} {
		st, body, err := exchange(t, p, &Request{Header: getRequest(u.addr, path)})
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		want := map[string][]byte{"/small": []byte("small"), "/big": big, "/chunked": big, "/empty": nil}[path]
		if !bytes.Equal(body, want) {
			t.Fatalf("%s: body of %d bytes, want %d", path, len(body), len(want))
		}
		if path == "/empty" && st != 204 {
			t.Fatalf("/empty: status %d", st)
		}
	}
	if n := u.opened.Load(); n != 1 {
		t.Fatalf("upstream saw %d connections; all exchanges should reuse one", n)
	}
}

func TestHeadResponseHasNoBody(t *testing.T) {
	u := startUpstream(t, func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("0123456789") })
	p := newSet(t, clock.Real{}).Pool("t", Config{Addr: u.addr})
	h := getRequest(u.addr, "/")
	h.SetMethod("HEAD")
	var resp fasthttp.Response
	streamed, err := p.Do(&Request{Header: h}, &resp, nil)
	if err != nil || streamed {
		t.Fatalf("streamed=%v err=%v", streamed, err)
	}
	if resp.Header.ContentLength() != 10 || !resp.SkipBody {
		t.Fatalf("HEAD: length %d skip %v", resp.Header.ContentLength(), resp.SkipBody)
	}
	// The connection is reusable: no body bytes were left on it.
	if _, body, err := exchange(t, p, &Request{Header: getRequest(u.addr, "/")}); err != nil || string(body) != "0123456789" {
		t.Fatalf("after HEAD: %q %v", body, err)
	}
}

// rawServer answers every connection with the script, for framings a
// well-behaved server library would not produce.
func rawServer(t *testing.T, script func(c net.Conn, br *bufio.Reader)) string {
	return loopback.Serve(t, func(c net.Conn) { script(c, bufio.NewReader(c)) })
}

func readRequestHead(br *bufio.Reader) error {
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return err
		}
		if line == "\r\n" {
			return nil
		}
	}
}

func TestUnframedBodyAndInterimResponses(t *testing.T) {
	addr := rawServer(t, func(c net.Conn, br *bufio.Reader) {
		if readRequestHead(br) != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"+
			"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end")
	})
	p := newSet(t, clock.Real{}).Pool("t", Config{Addr: addr})
	st, body, err := exchange(t, p, &Request{Header: getRequest(addr, "/")})
	if err != nil || st != 200 || string(body) != "until the end" {
		t.Fatalf("status %d body %q err %v", st, body, err)
	}
	if s := p.Stats(); s.Open != 0 {
		t.Fatalf("unframed body's connection kept: %+v", s)
	}
}

func TestBrokenResponses(t *testing.T) {
	tests := []struct {
		name, reply string
		kind        Kind
	}{
		{"closed before response", "", KindUpstream},
		{"garbage", "SMTP ready\r\n\r\n", KindUpstream},
		{"upgrade", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n", KindUpstream},
		{"short body", "HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\nshort", KindUpstream},
		{"bad chunk", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", KindUpstream},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			addr := rawServer(t, func(c net.Conn, br *bufio.Reader) {
				if readRequestHead(br) == nil {
					io.WriteString(c, tc.reply)
				}
			})
			p := newSet(t, clock.Real{}).Pool("t", Config{Addr: addr})
			_, _, err := exchange(t, p, &Request{Header: getRequest(addr, "/"), Deadline: time.Now().Add(5 * time.Second)})
			if KindOf(err) != tc.kind {
				t.Fatalf("err = %v (kind %v), want kind %v", err, KindOf(err), tc.kind)
			}
			if s := p.Stats(); s.Open != 0 || s.Idle != 0 {
				t.Fatalf("broken connection kept: %+v", s)
			}
		})
	}
}

// TestFailureBeforeTheStreamedBody: a body that will be streamed fails in
// Do, not in the stream, when the upstream ends or stalls before its
// first byte, so that the proxies can still answer for it; one that comes
// late, or an empty one ended by the close, streams as before.
func TestFailureBeforeTheStreamedBody(t *testing.T) {
	tests := []struct {
		name, head string
		late       string // sent after a pause, when not empty
		stall      bool   // neither closes nor sends more
		kind       Kind   // of Do's error; 0: none
		body       string
	}{
		{"length, closed", "HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n", "", false, KindUpstream, ""},
		{"chunked, closed", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", "", false, KindUpstream, ""},
		{"chunked, stalled", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", "", true, KindTimeout, ""},
		{"chunked, late", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", "5\r\nlate!\r\n0\r\n\r\n", false, 0, "late!"},
		{"unframed, empty", "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", "", false, 0, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			addr := rawServer(t, func(c net.Conn, br *bufio.Reader) {
				if readRequestHead(br) != nil {
					return
				}
				io.WriteString(c, tc.head)
				switch {
				case tc.stall:
					io.Copy(io.Discard, br) // until the client closes
				case tc.late != "":
					time.Sleep(50 * time.Millisecond) // the head's bytes must be read alone
					io.WriteString(c, tc.late)
				}
			})
			p := newSet(t, clock.Real{}).Pool("t", Config{Addr: addr})
			var resp fasthttp.Response
			fin := newFinish()
			req := &Request{Header: getRequest(addr, "/"), Deadline: time.Now().Add(300 * time.Millisecond)}
			streamed, err := p.Do(req, &resp, fin)
			if KindOf(err) != tc.kind {
				t.Fatalf("Do: err = %v (kind %v), want kind %v", err, KindOf(err), tc.kind)
			}
			if err != nil {
				if s := p.Stats(); s.Open != 0 || s.Idle != 0 {
					t.Fatalf("broken connection kept: %+v", s)
				}
				return
			}
			if !streamed {
				t.Fatal("not streamed")
			}
			body, rerr := io.ReadAll(resp.BodyStream())
			_ = resp.CloseBodyStream()
			if ferr := <-fin.done; rerr != nil || ferr != nil || string(body) != tc.body {
				t.Fatalf("body %q, read error %v, finish %v", body, rerr, ferr)
			}
		})
	}
}

// TestUpgradeSwitches: an Upgrade request's 101 leaves the connection to
// the caller, past the exchange's deadline, with what the upstream sent
// after its 101 first to read; the connection holds its slot in the pool
// until closed. (Without Upgrade a 101 is an error: TestBrokenResponses.)
func TestUpgradeSwitches(t *testing.T) {
	addr := rawServer(t, func(c net.Conn, br *bufio.Reader) {
		if readRequestHead(br) != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\nhello|")
		_, _ = io.Copy(c, br) // echoes until the caller's end of stream
	})
	p := newSet(t, clock.Real{}).Pool("t", Config{Addr: addr, MaxConns: 1})
	req := &Request{Header: getRequest(addr, "/"), Upgrade: true, Deadline: time.Now().Add(50 * time.Millisecond)}
	var resp fasthttp.Response
	if _, err := p.Do(req, &resp, newFinish()); err != nil || resp.StatusCode() != 101 || req.Switched == nil {
		t.Fatalf("Do: %v, status %d, switched %v", err, resp.StatusCode(), req.Switched != nil)
	}
	sw := req.Switched
	if s := p.Stats(); s.Open != 1 || s.Idle != 0 {
		t.Fatalf("switched connection not held: %+v", s)
	}
	time.Sleep(100 * time.Millisecond) // past the exchange's deadline, which must not cut the connection
	io.WriteString(sw, "ping")
	if err := sw.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if got, err := io.ReadAll(sw); err != nil || string(got) != "hello|ping" {
		t.Fatalf("read %q %v, want hello|ping then the end", got, err)
	}
	sw.Close()
	sw.Close() // a second Close frees nothing more
	if s := p.Stats(); s.Open != 0 {
		t.Fatalf("slot not freed: %+v", s)
	}
}

func TestDialAndTimeoutErrors(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := ln.Addr().String()
	ln.Close()
	p := newSet(t, clock.Real{}).Pool("dead", Config{Addr: dead})
	if _, _, err := exchange(t, p, &Request{Header: getRequest(dead, "/")}); KindOf(err) != KindDial {
		t.Fatalf("refused: err = %v, want a dial error", err)
	}

	release := make(chan struct{})
	u := startUpstream(t, func(ctx *fasthttp.RequestCtx) { <-release })
	defer close(release)
	q := newSet(t, clock.Real{}).Pool("slow", Config{Addr: u.addr})
	_, _, err := exchange(t, q, &Request{Header: getRequest(u.addr, "/"), Deadline: time.Now().Add(50 * time.Millisecond)})
	if KindOf(err) != KindTimeout {
		t.Fatalf("slow: err = %v, want a timeout", err)
	}
}

func TestMaxConnsQueuesAndTimesOut(t *testing.T) {
	var inFlight, peak atomic.Int64
	gate := make(chan struct{})
	u := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		n := inFlight.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		<-gate
		inFlight.Add(-1)
	})
	p := newSet(t, clock.Real{}).Pool("t", Config{Addr: u.addr, MaxConns: 2})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, err := exchange(t, p, &Request{Header: getRequest(u.addr, "/"), Deadline: time.Now().Add(10 * time.Second)})
			errs <- err
		}()
	}
	// Wait until two are at the upstream and six are queued in the pool.
	fasttest.WaitFor(t, "two in flight and six queued", func() bool { return p.Stats().Waiting == 6 && inFlight.Load() == 2 })
	// A caller whose deadline passes while queued gets a timeout.
	_, _, err := exchange(t, p, &Request{Header: getRequest(u.addr, "/"), Deadline: time.Now().Add(20 * time.Millisecond)})
	if KindOf(err) != KindTimeout {
		t.Fatalf("queued past deadline: %v", err)
	}
	// A caller with no deadline waits until its Wait ends (its client
	// hung up), and that is not the upstream's failure.
	wait, cancel := context.WithCancel(context.Background())
	cancelled := make(chan error, 1)
	go func() {
		_, _, err := exchange(t, p, &Request{Header: getRequest(u.addr, "/"), Wait: wait})
		cancelled <- err
	}()
	fasttest.WaitFor(t, "the unbounded caller queued", func() bool { return p.Stats().Waiting == 7 })
	cancel()
	if err := <-cancelled; KindOf(err) != KindClient {
		t.Fatalf("cancelled wait: %v, want a client-side error", err)
	}
	// A Wait whose own deadline passes first ends the wait as a timeout.
	bounded, stop := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer stop()
	if _, _, err := exchange(t, p, &Request{Header: getRequest(u.addr, "/"), Wait: bounded}); KindOf(err) != KindTimeout {
		t.Fatalf("wait past its context's deadline: %v, want a timeout", err)
	}
	close(gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if peak.Load() != 2 || u.opened.Load() != 2 {
		t.Fatalf("peak in flight %d, connections %d; want 2 and 2", peak.Load(), u.opened.Load())
	}
}

func TestIdleTimeoutAndStaleConnections(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	u := startUpstream(t, func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("ok") })
	s := newSet(t, clk)
	p := s.Pool("t", Config{Addr: u.addr, IdleTimeout: 3 * time.Second})
	if _, _, err := exchange(t, p, &Request{Header: getRequest(u.addr, "/")}); err != nil {
		t.Fatal(err)
	}
	tick := func() {
		armed := clk.TimerArmed()
		clk.Advance(time.Second)
		<-armed // the janitor finished its pass and re-armed
	}
	for range 3 {
		tick()
	}
	if st := p.Stats(); st.Idle != 1 {
		t.Fatalf("idle connection reaped too early: %+v", st)
	}
	for range 2 {
		tick()
	}
	fasttest.WaitFor(t, "the idle connection closed", func() bool { return u.closed.Load() == 1 })

	// A connection closed by the upstream while idle is detected before
	// reuse: the next exchange succeeds on a new connection.
	if _, _, err := exchange(t, p, &Request{Header: getRequest(u.addr, "/")}); err != nil {
		t.Fatal(err)
	}
	u.handler.Store(ptr(fasthttp.RequestHandler(func(ctx *fasthttp.RequestCtx) {
		ctx.SetBodyString("ok")
		ctx.SetConnectionClose()
	})))
	if _, _, err := exchange(t, p, &Request{Header: getRequest(u.addr, "/")}); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.Open != 0 {
		t.Fatalf("connection the upstream closed is kept: %+v", st)
	}
}

func ptr[T any](v T) *T { return &v }

// TestStaleIdleConnectionIsProbed: a connection the upstream closed while
// it was idle is found out before reuse, however short the idle time, with
// or without a janitor tick in between (upstreams with idle timeouts under
// a second closed connections warden then reused, and the exchange failed).
func TestStaleIdleConnectionIsProbed(t *testing.T) {
	for _, idle := range []time.Duration{0, time.Second} {
		t.Run(idle.String(), func(t *testing.T) {
			clk := clock.NewFake(time.Unix(1_700_000_000, 0))
			var conns []net.Conn
			var mu sync.Mutex
			addr := rawServer(t, func(c net.Conn, br *bufio.Reader) {
				mu.Lock()
				conns = append(conns, c)
				mu.Unlock()
				for readRequestHead(br) == nil {
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				}
			})
			s := newSet(t, clk)
			p := s.Pool("t", Config{Addr: addr})
			if _, _, err := exchange(t, p, &Request{Header: getRequest(addr, "/")}); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			conns[0].Close() // the upstream closes the idle connection
			mu.Unlock()
			if idle >= time.Second {
				armed := clk.TimerArmed()
				clk.Advance(idle)
				<-armed
			}
			if _, body, err := exchange(t, p, &Request{Header: getRequest(addr, "/")}); err != nil || string(body) != "ok" {
				t.Fatalf("exchange after the upstream closed the idle connection: %q %v", body, err)
			}
		})
	}
}

// TestUnrequestedBytesAreNeverReused: an upstream that answers and then
// writes a second, unrequested response on the same connection must not
// have it read as the answer to the next request (another client's, in a
// proxy), however soon that request comes. Before every reuse was peeked
// at, a connection idle less than 10 ms was reused unchecked.
func TestUnrequestedBytesAreNeverReused(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0)) // never advanced: no idle time passes
	sendRogue, wrote := make(chan struct{}), make(chan struct{})
	var conns atomic.Int64
	addr := rawServer(t, func(c net.Conn, br *bufio.Reader) {
		rogue := conns.Add(1) == 1 // only the first connection misbehaves
		for n := 1; readRequestHead(br) == nil; n++ {
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\nreq %03d", n)
			if n == 1 && rogue {
				// After the answer has been read: bytes that came with it
				// are dropped by release, a different path.
				<-sendRogue
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nrogue")
				close(wrote)
			}
		}
	})
	s := newSet(t, clk)
	var counted atomic.Int64
	s.OnUnrequested(func() { counted.Add(1) })
	p := s.Pool("t", Config{Addr: addr})
	if _, body, err := exchange(t, p, &Request{Header: getRequest(addr, "/")}); err != nil || string(body) != "req 001" {
		t.Fatalf("first exchange: %q %v", body, err)
	}
	close(sendRogue)
	select {
	case <-wrote:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream never wrote its unrequested response")
	}
	// On loopback the bytes are in warden's socket buffer once the
	// upstream's write has returned; wait until the kernel says so.
	waitReadable(t, p)
	_, body, err := exchange(t, p, &Request{Header: getRequest(addr, "/")})
	if err != nil {
		t.Fatal(err)
	}
	if string(body) != "req 001" {
		t.Fatalf("second exchange got %q: want a fresh connection's first answer, never the unrequested %q", body, "rogue")
	}
	if counted.Load() != 1 {
		t.Fatalf("unrequested bytes counted %d times, want 1", counted.Load())
	}
}

// waitReadable waits (bounded) until p's idle connection has bytes to
// read.
func waitReadable(t *testing.T, p *Pool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		p.mu.Lock()
		st := rawio.PeekUnknown
		if len(p.idle) > 0 {
			st = rawio.Peek(p.idle[len(p.idle)-1].raw)
		}
		p.mu.Unlock()
		if st == rawio.PeekData {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the unrequested bytes never reached the idle connection (%v)", st)
		}
		runtime.Gosched()
	}
}

func TestRequestBodies(t *testing.T) {
	u := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		n, err := io.Copy(io.Discard, ctx.RequestBodyStream())
		if err != nil {
			ctx.SetStatusCode(400)
			return
		}
		fmt.Fprintf(ctx, "%d %s", n, ctx.Request.Header.Peek("Transfer-Encoding"))
	})
	p := newSet(t, clock.Real{}).Pool("t", Config{Addr: u.addr})
	payload := strings.Repeat("x", 100_000)
	post := func(cl int) *fasthttp.RequestHeader {
		h := getRequest(u.addr, "/")
		h.SetMethod("POST")
		h.SetContentLength(cl)
		return h
	}
	for name, req := range map[string]*Request{
		"buffered": {Header: post(len(payload)), Body: []byte(payload)},
		"fixed":    {Header: post(len(payload)), Stream: strings.NewReader(payload)},
		"chunked":  {Header: post(-1), Stream: strings.NewReader(payload)},
	} {
		_, body, err := exchange(t, p, req)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want := "100000 "
		if name == "chunked" {
			want += "chunked"
		}
		if string(body) != want {
			t.Fatalf("%s: upstream read %q, want %q", name, body, want)
		}
	}
	// A client body that ends early is the client's failure.
	_, _, err := exchange(t, p, &Request{Header: post(10), Stream: strings.NewReader("short")})
	if KindOf(err) != KindClient {
		t.Fatalf("short client body: %v", err)
	}
	_, _, err = exchange(t, p, &Request{Header: post(-1), Stream: io.MultiReader(strings.NewReader("x"), errReader{})})
	if KindOf(err) != KindClient {
		t.Fatalf("failing client body: %v", err)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("client went away") }

func TestTLSOrigination(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "tls=%v host=%s body=%d", r.TLS != nil, r.Host, n)
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the untrusted handshake below is expected
	srv.StartTLS()
	defer srv.Close()
	addr := srv.Listener.Addr().String()
	cfg := srv.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
	cfg.ServerName = "example.com" // httptest's certificate names example.com
	p := newSet(t, clock.Real{}).Pool("tls", Config{Addr: addr, TLS: cfg})
	_, body, err := exchange(t, p, &Request{Header: getRequest("api.example.com", "/")})
	if err != nil || string(body) != "tls=true host=api.example.com body=0" {
		t.Fatalf("%q %v", body, err)
	}
	// A long body is written while the answer is read, on the same TLS
	// connection, which is then reused.
	h := getRequest("api.example.com", "/")
	h.SetMethod("POST")
	h.SetContentLength(8 << 20)
	_, body, err = exchange(t, p, &Request{Header: h, Stream: io.LimitReader(zeros{}, 8<<20)})
	if err != nil || string(body) != "tls=true host=api.example.com body=8388608" {
		t.Fatalf("long body over TLS: %q %v", body, err)
	}
	if s := p.Stats(); s.Open != 1 || s.Idle != 1 {
		t.Fatalf("pool after the long body: %+v, want its one connection idle", s)
	}
	bad := newSet(t, clock.Real{}).Pool("untrusted", Config{Addr: addr, TLS: &tls.Config{ServerName: "example.com"}})
	if _, _, err := exchange(t, bad, &Request{Header: getRequest("x", "/")}); KindOf(err) != KindDial {
		t.Fatalf("untrusted certificate: %v", err)
	}
}

func TestReplacedPoolFinishesInFlight(t *testing.T) {
	gate := make(chan struct{})
	entered := make(chan struct{}, 1)
	u := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) == "/slow" {
			entered <- struct{}{}
			<-gate
		}
		ctx.SetBodyString("ok")
	})
	s := newSet(t, clock.Real{})
	old := s.Pool("t", Config{Addr: u.addr, MaxConns: 4})
	if same := s.Pool("t", Config{Addr: u.addr, MaxConns: 4}); same != old {
		t.Fatal("unchanged settings gave a new pool")
	}
	done := make(chan error, 1)
	go func() {
		_, body, err := exchange(t, old, &Request{Header: getRequest(u.addr, "/slow")})
		if err == nil && string(body) != "ok" {
			err = fmt.Errorf("body %q", body)
		}
		done <- err
	}()
	<-entered
	repl := s.Pool("t", Config{Addr: u.addr, MaxConns: 8})
	if repl == old {
		t.Fatal("changed settings kept the old pool")
	}
	if _, _, err := exchange(t, repl, &Request{Header: getRequest(u.addr, "/")}); err != nil {
		t.Fatal(err)
	}
	close(gate)
	if err := <-done; err != nil {
		t.Fatalf("in-flight exchange on the replaced pool: %v", err)
	}
	if st := old.Stats(); st.Open != 0 || st.Idle != 0 {
		t.Fatalf("replaced pool kept its connection: %+v", st)
	}
	s.Retain(func(string) bool { return false })
	if s.Len() != 0 {
		t.Fatalf("Retain kept %d pools", s.Len())
	}
}

func TestDynamicPoolsAreDropped(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	u := startUpstream(t, func(ctx *fasthttp.RequestCtx) {})
	s := newSet(t, clk)
	p := s.Dynamic([]byte(u.addr), Config{Addr: u.addr, IdleTimeout: time.Second})
	if s.Dynamic([]byte(u.addr), Config{Addr: u.addr, IdleTimeout: time.Second}) != p {
		t.Fatal("dynamic pool not shared")
	}
	// Changed settings (a reload) replace it.
	q := s.Dynamic([]byte(u.addr), Config{Addr: u.addr, IdleTimeout: time.Second, MaxConns: 2})
	if q == p || s.Dynamic([]byte(u.addr), Config{Addr: u.addr, IdleTimeout: time.Second, MaxConns: 2}) != q {
		t.Fatal("a dynamic pool with other settings was not replaced once")
	}
	p = q
	if _, _, err := exchange(t, p, &Request{Header: getRequest(u.addr, "/")}); err != nil {
		t.Fatal(err)
	}
	for i := 0; s.Len() > 0; i++ {
		if i > 10 {
			t.Fatalf("dynamic pool never dropped: %+v", p.Stats())
		}
		armed := clk.TimerArmed()
		clk.Advance(time.Second)
		<-armed
	}
}

// TestDeadlineNotLeftOver: a deadline set for one exchange (or for a TLS
// handshake) must not cut a later exchange on the same connection that
// has none.
func TestDeadlineNotLeftOver(t *testing.T) {
	var slow atomic.Bool
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if slow.Load() {
			time.Sleep(400 * time.Millisecond)
		}
		io.WriteString(w, "ok")
	}))
	srv.StartTLS()
	defer srv.Close()
	cfg := srv.Client().Transport.(*http.Transport).TLSClientConfig
	p := newSet(t, clock.Real{}).Pool("tls", Config{Addr: srv.Listener.Addr().String(), TLS: cfg, ServerName: "example.com",
		DialTimeout: 200 * time.Millisecond})
	if _, _, err := exchange(t, p, &Request{Header: getRequest("x", "/")}); err != nil {
		t.Fatal(err)
	}
	slow.Store(true)
	if _, body, err := exchange(t, p, &Request{Header: getRequest("x", "/")}); err != nil || string(body) != "ok" {
		t.Fatalf("exchange without deadline after one with: %q %v", body, err)
	}
}

// TestReusedPastItsLastDeadline: an idle connection whose last exchange's
// deadline has passed still carries the next request. (A peek that read
// through the poller failed on the passed deadline and took it for
// closed, so every request after a quiet spell longer than the target's
// timeout dialled again.)
func TestReusedPastItsLastDeadline(t *testing.T) {
	u := startUpstream(t, func(ctx *fasthttp.RequestCtx) { ctx.WriteString("ok") })
	p := newSet(t, clock.Real{}).Pool("u", Config{Addr: u.addr})
	first := time.Now().Add(50 * time.Millisecond)
	if _, _, err := exchange(t, p, &Request{Header: getRequest("x", "/"), Deadline: first}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(first) + 20*time.Millisecond) // the deadline itself is what must pass
	if _, body, err := exchange(t, p, &Request{Header: getRequest("x", "/"), Deadline: time.Now().Add(5 * time.Second)}); err != nil || string(body) != "ok" {
		t.Fatalf("exchange after the last deadline passed: %q %v", body, err)
	}
	if n := u.opened.Load(); n != 1 {
		t.Fatalf("%d connections opened, want the first one reused", n)
	}
}

// TestMaxLifetimeRetires: connections are replaced after MaxLifetime, so
// a new dial (and a new DNS answer) is used even under steady reuse.
func TestMaxLifetimeRetires(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	u := startUpstream(t, func(ctx *fasthttp.RequestCtx) {})
	p := newSet(t, clk).Pool("t", Config{Addr: u.addr, MaxLifetime: 3 * time.Second})
	for round := range 3 {
		// Busy within a tick: the same connection every time.
		for range 5 {
			if _, _, err := exchange(t, p, &Request{Header: getRequest(u.addr, "/")}); err != nil {
				t.Fatal(err)
			}
		}
		if n := u.opened.Load(); n != int64(round+1) {
			t.Fatalf("round %d: %d connections", round, n)
		}
		for range 4 {
			armed := clk.TimerArmed()
			clk.Advance(time.Second)
			<-armed
		}
	}
}

// gatedReader returns first, then blocks until gate is closed, then
// returns rest and EOF.
type gatedReader struct {
	first, rest []byte
	gate        <-chan struct{}
}

func (g *gatedReader) Read(p []byte) (int, error) {
	if len(g.first) > 0 {
		n := copy(p, g.first)
		g.first = g.first[n:]
		return n, nil
	}
	<-g.gate
	if len(g.rest) == 0 {
		return 0, io.EOF
	}
	n := copy(p, g.rest)
	g.rest = g.rest[n:]
	return n, nil
}

// TestEarlyResponse: an upstream may answer before it has the whole
// request (a refusal after the head, the rest of the body read and
// dropped). The answer is then in before the request's last bytes go
// out, and the exchange must still read it rather than wait for more.
func TestEarlyResponse(t *testing.T) {
	answered := make(chan struct{})
	addr := rawServer(t, func(c net.Conn, br *bufio.Reader) {
		if readRequestHead(br) != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 413 Payload Too Large\r\nContent-Length: 4\r\n\r\nbig!")
		close(answered) // on loopback the bytes are in the client's socket once written
		io.Copy(io.Discard, br)
	})
	p := newSet(t, clock.Real{}).Pool("t", Config{Addr: addr})
	h := getRequest(addr, "/")
	h.SetMethod("POST")
	const size = 3 * writeBufferSize
	h.SetContentLength(size)
	// More than the write buffer first, so the head goes out on its own;
	// the last bytes only once the answer is in.
	body := &gatedReader{first: make([]byte, 2*writeBufferSize), rest: make([]byte, writeBufferSize), gate: answered}
	st, got, err := exchange(t, p, &Request{Header: h, Stream: body, Deadline: time.Now().Add(5 * time.Second)})
	if err != nil || st != 413 || string(got) != "big!" {
		t.Fatalf("status %d body %q err %v", st, got, err)
	}
}

// TestBytesPastTheResponseAreNotReused: bytes an upstream sends past the
// end of a response (a body after a HEAD answer, more than Content-Length)
// must not be read as the next exchange's response: the connection is
// closed instead of pooled.
func TestBytesPastTheResponseAreNotReused(t *testing.T) {
	const evil = "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nEVIL"
	tests := []struct {
		name, method, junk string
	}{
		{"a body after a HEAD answer", "HEAD", "HTTP/1.1 200 OK\r\nContent-Length: 44\r\n\r\n" + evil},
		{"more than Content-Length", "GET", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" + evil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := rawServer(t, func(c net.Conn, br *bufio.Reader) {
				for {
					line, err := br.ReadString('\n')
					if err != nil || readRequestHead(br) != nil {
						return
					}
					answer := "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
					if strings.Contains(line, "/junk") {
						answer = tt.junk // in one write: in the reader's buffer at once
					}
					if _, err := io.WriteString(c, answer); err != nil {
						return
					}
				}
			})
			p := newSet(t, clock.Real{}).Pool("t", Config{Addr: addr})
			h := getRequest(addr, "/junk")
			h.SetMethod(tt.method)
			if _, _, err := exchange(t, p, &Request{Header: h}); err != nil {
				t.Fatal(err)
			}
			for i := range 3 {
				if code, body, err := exchange(t, p, &Request{Header: getRequest(addr, "/")}); err != nil || code != 200 || string(body) != "ok" {
					t.Fatalf("exchange %d after the stray bytes: %d %q %v", i+1, code, body, err)
				}
			}
		})
	}
}

// TestAbort: Abort cuts short a request waiting for its answer (the
// connection is closed, not reused, and the error is the client's), and
// an Abort that came first sends nothing and leaves the connection in
// the pool.
func TestAbort(t *testing.T) {
	gate := make(chan struct{})
	var requests atomic.Int64
	u := startUpstream(t, func(ctx *fasthttp.RequestCtx) {
		requests.Add(1)
		if string(ctx.Path()) == "/hold" {
			<-gate
		}
	})
	var once sync.Once
	open := func() { once.Do(func() { close(gate) }) }
	defer open()
	p := newSet(t, clock.Real{}).Pool("t", Config{Addr: u.addr})

	var a Abort
	done := make(chan error, 1)
	go func() {
		_, _, err := exchange(t, p, &Request{Header: getRequest(u.addr, "/hold"), Abort: &a})
		done <- err
	}()
	fasttest.WaitFor(t, "the request at the upstream", func() bool { return requests.Load() == 1 })
	a.Abort()
	err := <-done
	if KindOf(err) != KindClient || !errors.Is(err, ErrAbandoned) {
		t.Fatalf("aborted exchange: %v, want a client error with ErrAbandoned", err)
	}
	if st := p.Stats(); st.Open != 0 || st.Idle != 0 {
		t.Fatalf("pool after the abort: %+v, want the connection gone", st)
	}
	open() // the upstream's answer finds the connection closed
	fasttest.WaitFor(t, "the upstream to see its connection closed", func() bool { return u.closed.Load() == 1 })

	if _, _, err := exchange(t, p, &Request{Header: getRequest(u.addr, "/")}); err != nil {
		t.Fatal(err)
	}
	a.Reset()
	a.Abort()
	if _, _, err := exchange(t, p, &Request{Header: getRequest(u.addr, "/"), Abort: &a}); !errors.Is(err, ErrAbandoned) {
		t.Fatalf("exchange aborted before it began: %v, want ErrAbandoned", err)
	}
	if n := requests.Load(); n != 2 {
		t.Fatalf("upstream saw %d requests, want 2: an exchange aborted first was sent", n)
	}
	a.Reset()
	if _, _, err := exchange(t, p, &Request{Header: getRequest(u.addr, "/"), Abort: &a}); err != nil {
		t.Fatalf("after Reset: %v", err)
	}
	if n := u.opened.Load(); n != 2 {
		t.Fatalf("upstream saw %d connections, want 2: the one an early abort left idle is reused", n)
	}
}

// TestHTTP10RequestGoesAsHTTP11: a request read from an HTTP/1.0 client
// goes upstream as warden's own HTTP/1.1 request, with a Host when it had
// none, and the connection stays for the next request; the header keeps
// the client's version for framing its response.
func TestHTTP10RequestGoesAsHTTP11(t *testing.T) {
	heads := make(chan string, 2)
	addr := loopback.Serve(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for range 2 {
			req, err := http.ReadRequest(br)
			if err != nil {
				heads <- err.Error()
				return
			}
			heads <- fmt.Sprintf("%s %s %s host=%q", req.Method, req.RequestURI, req.Proto, req.Host)
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	p := newSet(t, clock.Real{}).Pool("t", Config{Addr: addr})
	cases := []struct{ raw, want string }{
		{"GET /old HTTP/1.0\r\n\r\n", fmt.Sprintf("GET /old HTTP/1.1 host=%q", addr)},
		{"GET /named HTTP/1.0\r\nHost: api.test\r\n\r\n", `GET /named HTTP/1.1 host="api.test"`},
	}
	for _, tc := range cases {
		var h fasthttp.RequestHeader
		if err := h.Read(bufio.NewReader(strings.NewReader(tc.raw))); err != nil {
			t.Fatal(err)
		}
		h.ResetConnectionClose() // as the proxies' StripRequest does
		if _, _, err := exchange(t, p, &Request{Header: &h}); err != nil {
			t.Fatalf("%q: %v", tc.raw, err)
		}
		if got := <-heads; got != tc.want {
			t.Errorf("upstream read %s, want %s", got, tc.want)
		}
		if h.IsHTTP11() || string(h.Protocol()) != "HTTP/1.0" {
			t.Errorf("the client's version became %s", h.Protocol())
		}
	}
}

// TestAnswerBeforeTheWholeBody: an upstream that answers a long upload
// before reading all of it (a 413, a 401) and then closes the connection,
// or stops reading it, gets its answer through rather than a failed
// write. Sending stops at the answer (BodyCut), as Envoy's does, and the
// connection, carrying half a request, is not reused. An upstream that
// reads the whole body first keeps its connection.
func TestAnswerBeforeTheWholeBody(t *testing.T) {
	const refusal = "HTTP/1.1 413 Payload Too Large\r\nContent-Length: 4\r\n"
	const size = 64 << 20 // past any socket buffer on loopback
	refuseAndClose := func(c net.Conn, br *bufio.Reader, _ <-chan struct{}) {
		if readRequestHead(br) == nil {
			io.WriteString(c, refusal+"Connection: close\r\n\r\nbig!")
		}
	}
	tests := []struct {
		name    string
		script  func(c net.Conn, br *bufio.Reader, end <-chan struct{})
		framing string // "length", "chunked", or "buffered": req.Body
		status  int
		body    string
		cut     bool
		idle    int
	}{
		{"refused, then closed", refuseAndClose, "length", 413, "big!", true, 0},
		{"refused, chunked, then closed", refuseAndClose, "chunked", 413, "big!", true, 0},
		{"refused, buffered, then closed", refuseAndClose, "buffered", 413, "big!", true, 0},
		{"refused, no longer read", func(c net.Conn, br *bufio.Reader, end <-chan struct{}) {
			if readRequestHead(br) == nil {
				io.WriteString(c, refusal+"\r\nbig!")
				<-end
			}
		}, "length", 413, "big!", true, 0},
		{"answered after the whole body", func(c net.Conn, br *bufio.Reader, _ <-chan struct{}) {
			if readRequestHead(br) == nil {
				if n, err := io.CopyN(io.Discard, br, size); err == nil && n == size {
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
					readRequestHead(br) // the pool keeps the connection open
				}
			}
		}, "length", 200, "ok", false, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			end := make(chan struct{})
			addr := rawServer(t, func(c net.Conn, br *bufio.Reader) { tt.script(c, br, end) })
			t.Cleanup(func() { close(end) }) // before rawServer's cleanup waits for the script
			p := newSet(t, clock.Real{}).Pool("t", Config{Addr: addr})
			h := getRequest(addr, "/upload")
			h.SetMethod("POST")
			h.SetContentLength(size)
			req := &Request{Header: h, Stream: io.LimitReader(zeros{}, size), Deadline: time.Now().Add(10 * time.Second)}
			switch tt.framing {
			case "chunked":
				h.SetContentLength(-1)
			case "buffered":
				req.Stream, req.Body = nil, make([]byte, size)
			}
			st, got, err := exchange(t, p, req)
			if err != nil || st != tt.status || string(got) != tt.body {
				t.Fatalf("status %d body %q err %v; want %d %q", st, got, err, tt.status, tt.body)
			}
			if req.BodyCut != tt.cut {
				t.Errorf("BodyCut %v, want %v", req.BodyCut, tt.cut)
			}
			if s := p.Stats(); s.Idle != tt.idle || s.Open != tt.idle {
				t.Errorf("pool after the exchange: %+v, want %d open and idle", s, tt.idle)
			}
		})
	}
}

// zeros reads as an endless run of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// TestLongUploadFailures: the failures of a long upload sent while its
// answer is watched for are still told apart: an upstream that closes
// without answering is the upstream's failure, not a timeout of the write
// it cut short, and a client body that fails is the client's.
func TestLongUploadFailures(t *testing.T) {
	const size = 64 << 20
	tests := []struct {
		name   string
		script func(c net.Conn, br *bufio.Reader, end <-chan struct{})
		body   io.Reader
		kind   Kind
	}{
		{"closed without an answer", func(c net.Conn, br *bufio.Reader, end <-chan struct{}) {
			if readRequestHead(br) == nil {
				// Closed for sending only, and no longer read: the write
				// blocks until the read's end cuts it short.
				c.(*net.TCPConn).CloseWrite()
				<-end
			}
		}, io.LimitReader(zeros{}, size), KindUpstream},
		{"the client body fails", func(c net.Conn, br *bufio.Reader, _ <-chan struct{}) { io.Copy(io.Discard, br) },
			io.MultiReader(io.LimitReader(zeros{}, 1<<20), errReader{}), KindClient},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			end := make(chan struct{})
			addr := rawServer(t, func(c net.Conn, br *bufio.Reader) { tt.script(c, br, end) })
			t.Cleanup(func() { close(end) })
			p := newSet(t, clock.Real{}).Pool("t", Config{Addr: addr})
			h := getRequest(addr, "/upload")
			h.SetMethod("POST")
			h.SetContentLength(size)
			req := &Request{Header: h, Stream: tt.body, Deadline: time.Now().Add(10 * time.Second)}
			_, _, err := exchange(t, p, req)
			if KindOf(err) != tt.kind || isTimeout(err) {
				t.Fatalf("err %v (kind %v), want a %v error that is no timeout", err, KindOf(err), tt.kind)
			}
			if s := p.Stats(); s.Open != 0 {
				t.Errorf("pool after the failure: %+v", s)
			}
		})
	}
}
