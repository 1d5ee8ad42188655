package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warden-dev/warden/internal/testkit/fasttest"
	"github.com/warden-dev/warden/internal/testkit/loopback"
	"github.com/warden-dev/warden/proxy/forward"
)

func TestAbsoluteFormAndHopByHop(t *testing.T) {
	up := fasttest.StartUpstream(t, func(ctx *fasthttp.RequestCtx) {
		fmt.Fprintf(ctx, "%s %s host=%s conn=%q proxy=%q hop=%q", ctx.Method(), ctx.Request.Header.RequestURI(), ctx.Host(),
			ctx.Request.Header.Peek("Connection"), ctx.Request.Header.Peek("Proxy-Authorization"), ctx.Request.Header.Peek("X-Hop"))
	})
	f := start(t, egressPolicy("  allow_unlisted: true", ""), nil)
	resp, body := fasttest.Raw(t, f.addr, "GET http://"+up.Addr+"/v1/charges/ch_1234567890?c=1 HTTP/1.1\r\nHost: "+up.Addr+
		"\r\nProxy-Authorization: Basic x\r\nConnection: X-Hop\r\nX-Hop: 1\r\n\r\n")
	want := fmt.Sprintf(`GET /v1/charges/ch_1234567890?c=1 host=%s conn="" proxy="" hop=""`, up.Addr)
	if resp.StatusCode != 200 || string(body) != want {
		t.Fatalf("%d %q\nwant %q", resp.StatusCode, body, want)
	}
	// Through a real HTTP_PROXY client, and counted under the unlisted label.
	if r := f.do(t, "GET", "http://"+up.Addr+"/x", nil); r.status != 200 {
		t.Fatalf("%+v", r)
	}
	if n := fasttest.Value(f.gov.Metrics.Requests.WithLabelValues("egress", "_unlisted", "200")); n != 2 {
		t.Fatalf("warden_requests_total{egress,_unlisted,200} = %v", n)
	}
}

func TestOriginFormRoutedByHost(t *testing.T) {
	up := fasttest.StartUpstream(t, func(ctx *fasthttp.RequestCtx) { fmt.Fprintf(ctx, "host=%s uri=%s", ctx.Host(), ctx.RequestURI()) })
	f := start(t, egressPolicy("  allow_unlisted: false", "targets:\n"+target("api", []string{"api.test"}, "http://"+up.Addr, "")), nil)
	resp, body := fasttest.Raw(t, f.addr, "GET /v1/x HTTP/1.1\r\nHost: api.test\r\n\r\n")
	if resp.StatusCode != 200 || string(body) != "host="+up.Addr+" uri=/v1/x" {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if n := fasttest.Value(f.gov.Metrics.Requests.WithLabelValues("egress", "api", "200")); n != 1 {
		t.Fatalf("warden_requests_total{egress,api,200} = %v", n)
	}
}

func TestUnlistedRefused(t *testing.T) {
	up := fasttest.StartUpstream(t, func(ctx *fasthttp.RequestCtx) {})
	f := start(t, egressPolicy("  allow_unlisted: false", "targets:\n"+target("api", []string{"api.test"}, "http://"+up.Addr, "")), nil)
	r := f.do(t, "GET", "http://other.test/", nil)
	if r.status != 403 || r.header.Get("X-Warden-Control") != "allow_unlisted" || !strings.Contains(r.body, `"host":"other.test"`) {
		t.Fatalf("%+v", r)
	}
	if n := fasttest.Value(f.gov.Metrics.Rejections.WithLabelValues("allow_unlisted", "egress")); n != 1 {
		t.Fatalf("rejections = %v", n)
	}
	if up.Requests.Load() != 0 {
		t.Fatal("unlisted request reached an upstream")
	}
}

// TestTargetMatching: host:port matches that port only, host any port,
// case-insensitively; the most specific entry wins.
func TestTargetMatching(t *testing.T) {
	name := func(n string) fasthttp.RequestHandler {
		return func(ctx *fasthttp.RequestCtx) { ctx.WriteString(n) }
	}
	a := fasttest.StartUpstream(t, name("port-8080"))
	b := fasttest.StartUpstream(t, name("any-port"))
	c := fasttest.StartUpstream(t, name("v6"))
	f := start(t, egressPolicy("  allow_unlisted: false", "targets:\n"+
		target("p8080", []string{"svc.test:8080"}, "http://"+a.Addr, "")+
		target("anyport", []string{"SVC.test", "other.test:9"}, "http://"+b.Addr, "")+
		target("v6", []string{"'[::1]:7'"}, "http://"+c.Addr, "")), nil)
	tests := []struct{ url, want string }{
		{"http://svc.test:8080/", "port-8080"},
		{"http://Svc.Test:8080/", "port-8080"},
		{"http://svc.test:9090/", "any-port"},
		{"http://svc.test/", "any-port"},
		{"http://other.test:9/", "any-port"},
		{"http://other.test:10/", "403"},
		{"http://[::1]:7/", "v6"},
		{"http://[::1]:8/", "403"},
	}
	for _, tc := range tests {
		r := f.do(t, "GET", tc.url, nil)
		got := r.body
		if r.status == 403 {
			got = "403"
		}
		if got != tc.want {
			t.Errorf("%s → %q (%d), want %q", tc.url, got, r.status, tc.want)
		}
	}
}

func TestTLSOrigination(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "tls=%v host=%s path=%s", r.TLS != nil, r.Host, r.URL.Path)
	}))
	defer srv.Close()
	roots := srv.Client().Transport.(*http.Transport).TLSClientConfig
	f := start(t, egressPolicy("  allow_unlisted: false", "targets:\n"+
		target("secure", []string{"secure.test"}, "https://"+srv.Listener.Addr().String(), "")), roots)
	r := f.do(t, "GET", "http://secure.test/charges", nil)
	want := "tls=true host=" + srv.Listener.Addr().String() + " path=/charges"
	if r.status != 200 || r.body != want {
		t.Fatalf("%+v\nwant %s", r, want)
	}
}

func TestConnectTunnel(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "through the tunnel: %s", r.URL.Path)
	}))
	defer srv.Close()
	f := start(t, egressPolicy("  allow_unlisted: true", ""), nil)
	proxy, _ := url.Parse("http://" + f.addr)
	tr := srv.Client().Transport.(*http.Transport).Clone()
	tr.Proxy = http.ProxyURL(proxy)
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	defer tr.CloseIdleConnections()
	for i := range 3 { // the tunnel is reused by the client's keep-alive
		resp, err := c.Get(srv.URL + "/p" + fmt.Sprint(i))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := fmt.Sprintf("through the tunnel: /p%d", i); string(b) != want {
			t.Fatalf("%q, want %q", b, want)
		}
	}
	// The 200 is warden's own, so it carries warden's Date.
	addr := srv.Listener.Addr().String()
	head := fasttest.RawHead(t, f.addr, "CONNECT "+addr+" HTTP/1.1\r\nHost: "+addr+"\r\n\r\n")
	if want := "HTTP/1.1 200 Connection Established\r\nDate: " + f.clk.Now().UTC().Format(http.TimeFormat) + "\r\n"; head != want {
		t.Fatalf("CONNECT answered %q, want %q", head, want)
	}
	// A CONNECT that cannot dial is a 502 counted against the target.
	dead := loopback.FreeAddr(t)
	resp, body := fasttest.Raw(t, f.addr, "CONNECT "+dead+" HTTP/1.1\r\nHost: "+dead+"\r\n\r\n")
	if resp.StatusCode != 502 || resp.Header.Get("X-Warden-Control") != "upstream" {
		t.Fatalf("dead CONNECT: %d %s", resp.StatusCode, body)
	}
}

func TestConnectFailuresOpenBreaker(t *testing.T) {
	dead := loopback.FreeAddr(t)
	f := start(t, egressPolicy("  allow_unlisted: false", "targets:\n"+target("db", []string{dead}, "",
		"circuit_breaker: { enabled: true, minimum_requests: 2, failure_ratio: 0.5, open: 5s }")), nil)
	for range 2 {
		resp, _ := fasttest.Raw(t, f.addr, "CONNECT "+dead+" HTTP/1.1\r\nHost: "+dead+"\r\n\r\n")
		if resp.StatusCode != 502 {
			t.Fatalf("dial failure: %d", resp.StatusCode)
		}
	}
	resp, body := fasttest.Raw(t, f.addr, "CONNECT "+dead+" HTTP/1.1\r\nHost: "+dead+"\r\n\r\n")
	if resp.StatusCode != 503 || !strings.Contains(string(body), `"control":"circuit_breaker","target":"db"`) {
		t.Fatalf("open breaker on CONNECT: %d %s", resp.StatusCode, body)
	}
}

func TestTimeoutBoundsExchange(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	up := fasttest.StartUpstream(t, func(ctx *fasthttp.RequestCtx) {
		select {
		case <-release:
		case <-time.After(5 * time.Second):
		}
	})
	f := start(t, egressPolicy("  allow_unlisted: false", "targets:\n"+target("slow", []string{"slow.test"}, "http://"+up.Addr, "timeout: 100ms")), nil)
	r := f.do(t, "GET", "http://slow.test/", nil)
	if r.status != 504 || r.header.Get("X-Warden-Control") != "timeout" || !strings.Contains(r.body, `"control":"timeout","target":"slow"`) {
		t.Fatalf("%+v", r)
	}
	if n := fasttest.Value(f.gov.Metrics.Rejections.WithLabelValues("timeout", "slow")); n != 1 {
		t.Fatalf("rejections{timeout,slow} = %v", n)
	}
}

func TestEgressRefusesSmugglingAndLoops(t *testing.T) {
	up := fasttest.StartUpstream(t, func(ctx *fasthttp.RequestCtx) {})
	f := start(t, egressPolicy("  allow_unlisted: true", ""), nil)
	for _, raw := range []string{
		"POST http://" + up.Addr + "/ HTTP/1.1\r\nHost: " + up.Addr + "\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"GET http://" + up.Addr + "/ HTTP/1.1\r\nHost: " + up.Addr + "\r\nX: a\r\n b\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: " + f.addr + "\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: localhost:" + f.addr[strings.LastIndexByte(f.addr, ':')+1:] + "\r\n\r\n",
		"GET ftp://x/ HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: bad host\r\n\r\n",
		// Userinfo is refused, not passed on or routed by (RFC 9110 §4.2.4).
		"GET http://user:pw@" + up.Addr + "/ HTTP/1.1\r\nHost: " + up.Addr + "\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: user@" + up.Addr + "\r\n\r\n",
		"CONNECT user@" + up.Addr + " HTTP/1.1\r\nHost: " + up.Addr + "\r\n\r\n",
	} {
		resp, body := fasttest.Raw(t, f.addr, raw)
		if resp.StatusCode != 400 {
			t.Errorf("%q → %d %s, want 400", raw, resp.StatusCode, body)
		}
	}
	if up.Requests.Load() != 0 {
		t.Fatal("a refused request reached the upstream")
	}
}

func TestLargeBodiesStream(t *testing.T) {
	up := fasttest.StartUpstream(t, func(ctx *fasthttp.RequestCtx) {
		n, _ := io.Copy(io.Discard, ctx.RequestBodyStream())
		ctx.SetBodyStream(strings.NewReader(strings.Repeat("y", 3<<20)), 3<<20)
		ctx.Response.Header.Set("X-Read", fmt.Sprint(n))
	})
	f := start(t, egressPolicy("  allow_unlisted: true", ""), nil)
	c := f.client()
	defer c.CloseIdleConnections()
	resp, err := c.Post("http://"+up.Addr+"/up", "application/octet-stream", strings.NewReader(strings.Repeat("x", 5<<20)))
	if err != nil {
		t.Fatal(err)
	}
	n, _ := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.Header.Get("X-Read") != fmt.Sprint(5<<20) || n != 3<<20 {
		t.Fatalf("upstream read %s, client read %d", resp.Header.Get("X-Read"), n)
	}
}

func TestDrainWaitsForTunnelsThenCuts(t *testing.T) {
	// An echo server as the tunnel's far end.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c)
	}()
	defer func() { ln.Close(); wg.Wait() }()
	f := start(t, egressPolicy("  allow_unlisted: true", ""), nil)
	c, br := openTunnel(t, f.addr, ln.Addr().String())
	io.WriteString(c, "ping")
	buf := make([]byte, 4)
	if _, err := io.ReadFull(br, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo through the tunnel: %q %v", buf, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	if err := f.eg.Shutdown(ctx); err == nil {
		t.Fatal("shutdown reported success while a tunnel was open past the deadline")
	}
	t.Logf("shutdown took %v", time.Since(t0))
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("tunnel still open after the drain deadline")
	}
}

var _ = tls.Config{}

// TestTunnelPassesUpstreamEOF: when the far end closes, the client sees
// the end of the stream (a server speaking until close, like an HTTP/1.0
// response, relies on it) and the tunnel's pool slot is released once the
// client closes in turn.
func TestTunnelPassesUpstreamEOF(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		io.WriteString(c, "hello, then goodbye")
		c.Close()
	}()
	defer func() { ln.Close(); <-served }()
	f := start(t, egressPolicy("  allow_unlisted: false", "targets:\n"+target("far", []string{ln.Addr().String()}, "", "pools: [far]")+
		"pools:\n  far: { concurrency: 1 }\n"), nil)
	c, br := openTunnel(t, f.addr, ln.Addr().String())
	// The deadline only bounds a failure: the EOF is what is waited for.
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(br)
	if err != nil || string(got) != "hello, then goodbye" {
		t.Fatalf("read %q, %v; want the far end's bytes, then EOF", got, err)
	}
	c.Close()
	inFlight := f.gov.Metrics.PoolInFlight.WithLabelValues("far")
	fasttest.WaitFor(t, "the tunnel's pool slot to be released", func() bool { return fasttest.Value(inFlight) == 0 })
}

// openTunnel opens a CONNECT tunnel to far through the egress at addr; the
// connection is closed when the test ends.
func openTunnel(t *testing.T, addr, far string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", far, far)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: "CONNECT"})
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	return c, br
}

// TestHTTP10ClientGetsALength: through the egress, an HTTP/1.0 client gets
// a chunked response with a Content-Length, or, past forward.HTTP10BodyMax,
// a 502 saying why.
func TestHTTP10ClientGetsALength(t *testing.T) {
	// A raw upstream, since fasthttp's own would frame its answer to an
	// HTTP/1.0 request with a length.
	addr := loopback.Serve(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		line, err := br.ReadString('\n')
		for err == nil {
			var l string
			if l, err = br.ReadString('\n'); l == "\r\n" {
				break
			}
		}
		n := 100_000
		if strings.Contains(line, "/big") {
			n = forward.HTTP10BodyMax + 1
		}
		bw := bufio.NewWriter(c)
		bw.WriteString("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
		chunk := strings.Repeat("x", 10_000)
		for n > 0 {
			k := min(n, len(chunk))
			fmt.Fprintf(bw, "%x\r\n%s\r\n", k, chunk[:k])
			n -= k
		}
		bw.WriteString("0\r\n\r\n")
		bw.Flush()
	})
	f := start(t, egressPolicy("  allow_unlisted: false", "targets:\n"+target("api", []string{"api.test"}, "http://"+addr, "")), nil)
	resp, body := fasttest.Raw(t, f.addr, "GET http://api.test/ HTTP/1.0\r\nHost: api.test\r\n\r\n")
	if resp.StatusCode != 200 || resp.ContentLength != 100_000 || len(resp.TransferEncoding) != 0 || len(body) != 100_000 {
		t.Fatalf("HTTP/1.0: %d length %d encoding %v, %d bytes", resp.StatusCode, resp.ContentLength, resp.TransferEncoding, len(body))
	}
	resp, body = fasttest.Raw(t, f.addr, "GET http://api.test/big HTTP/1.0\r\nHost: api.test\r\n\r\n")
	if resp.StatusCode != 502 || resp.Header.Get("X-Warden-Control") != "upstream" || !strings.Contains(string(body), "HTTP/1.0 client") {
		t.Fatalf("HTTP/1.0, too long: %d %v, %d bytes", resp.StatusCode, resp.Header, len(body))
	}
	fasttest.WaitFor(t, "the 502 recorded", func() bool {
		return fasttest.Value(f.gov.Metrics.Requests.WithLabelValues("egress", "api", "502")) == 1
	})
	// Like every upstream 502, it is a refusal named by its control.
	if n := fasttest.Value(f.gov.Metrics.Rejections.WithLabelValues("upstream", "api")); n != 1 {
		t.Fatalf("rejections{upstream,api} = %v", n)
	}
}

// TestUnreadableRequestCounted: a request fasthttp cannot parse (here a
// duplicate Content-Length) is refused with warden's JSON 400 before any
// target is chosen, and counted like the egress's other refusals.
func TestUnreadableRequestCounted(t *testing.T) {
	up := fasttest.StartUpstream(t, func(ctx *fasthttp.RequestCtx) {})
	f := start(t, egressPolicy("  allow_unlisted: true", ""), nil)
	resp, body := fasttest.Raw(t, f.addr, "POST http://"+up.Addr+"/ HTTP/1.1\r\nHost: "+up.Addr+
		"\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello")
	if resp.StatusCode != 400 || !strings.HasPrefix(string(body), `{"error":`) || up.Requests.Load() != 0 {
		t.Fatalf("%d %q, upstream saw %d", resp.StatusCode, body, up.Requests.Load())
	}
	if n := fasttest.Value(f.gov.Metrics.Requests.WithLabelValues("egress", unlistedName, "400")); n != 1 {
		t.Fatalf("warden_requests_total{egress,%s,400} = %v", unlistedName, n)
	}
}

// TestOptionsWithoutPathIsAsteriskForm: RFC 9112 §3.2.4 — an absolute-form
// OPTIONS with no path goes upstream as "OPTIONS *"; with a path, as is.
func TestOptionsWithoutPathIsAsteriskForm(t *testing.T) {
	up := fasttest.StartUpstream(t, func(ctx *fasthttp.RequestCtx) { ctx.Write(ctx.RequestURI()) })
	f := start(t, egressPolicy("  allow_unlisted: true", ""), nil)
	tests := []struct{ target, want string }{
		{"http://" + up.Addr, "*"},
		{"http://" + up.Addr + "/", "/"},
		{"http://" + up.Addr + "?q=1", "/?q=1"},
	}
	for _, tt := range tests {
		resp, body := fasttest.Raw(t, f.addr, "OPTIONS "+tt.target+" HTTP/1.1\r\nHost: "+up.Addr+"\r\nConnection: close\r\n\r\n")
		if resp.StatusCode != 200 || string(body) != tt.want {
			t.Errorf("OPTIONS %s: %d, upstream saw %q, want %q", tt.target, resp.StatusCode, body, tt.want)
		}
	}
}

// TestExpectContinueCheckedBeforeTheBody: a request that waits for 100
// Continue before its body hears a refusal its head decides (an unlisted
// host, the tenant cap, an open breaker) instead, and a request told to go
// on is counted against its tenant once.
func TestExpectContinueCheckedBeforeTheBody(t *testing.T) {
	up := startStatusUpstream(t)
	f := start(t, egressPolicy("  allow_unlisted: false\n  tenant: { header: x-tenant-id, rate: 100, window: 60 }\n  tenants: { acme: { rate: 2, window: 60 } }",
		"targets:\n"+target("flaky", []string{"flaky.test"}, "http://"+up.Addr, flakyBreaker)), nil)
	// ask sends a POST's head through the egress and returns the first
	// answer to it: 100 Continue or the final one.
	ask := func(host, tenant string, length int) (*http.Response, *bufio.Reader, net.Conn) {
		t.Helper()
		return fasttest.FirstAnswer(t, f.addr, fmt.Sprintf("POST http://%s/ HTTP/1.1\r\nHost: %s\r\nX-Tenant-Id: %s\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n", host, host, tenant, length))
	}
	refusedBeforeBody := func(resp *http.Response, status int, control, body string) {
		t.Helper()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != status || resp.Header.Get("X-Warden-Control") != control || string(b) != body {
			t.Fatalf("got %d %v %s; want %d from %s before the body", resp.StatusCode, resp.Header, b, status, control)
		}
	}

	// goesThrough asks, is told to go on, sends a 5-byte body and gets 200.
	goesThrough := func(tenant, what string) {
		t.Helper()
		resp, br, c := ask("flaky.test", tenant, 5)
		if resp.StatusCode != http.StatusContinue {
			t.Fatalf("%s: %d, want 100 Continue", what, resp.StatusCode)
		}
		io.WriteString(c, "hello")
		if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %v %v, want 200", what, resp, err)
		}
	}

	goesThrough("acme", "first request, within the cap")
	if r := f.do(t, "GET", "http://flaky.test/", map[string]string{"X-Tenant-Id": "acme"}); r.status != 200 {
		t.Fatalf("second request, the cap's last: %+v (the first was counted twice?)", r)
	}
	resp, _, _ := ask("flaky.test", "acme", 10<<20)
	refusedBeforeBody(resp, 429, "tenant_rate", `{"control":"tenant_rate","quota":"tenant:acme","limit":2,"current":3,"retryAfterSeconds":40}`)

	resp, _, _ = ask("elsewhere.test", "beta", 10<<20)
	refusedBeforeBody(resp, 403, "allow_unlisted", `{"control":"allow_unlisted","host":"elsewhere.test","error":"no target lists this host and egress.allow_unlisted is false"}`)

	trip(t, f, up, 2) // with the two successes: minimum_requests 4 at ratio 0.5
	resp, _, _ = ask("flaky.test", "gamma", 10<<20)
	refusedBeforeBody(resp, 503, "circuit_breaker", `{"control":"circuit_breaker","target":"flaky","retryAfterSeconds":5}`)
	if n := up.Requests.Load(); n != 4 {
		t.Errorf("upstream saw %d requests, want 4", n)
	}
	if n := fasttest.Value(f.gov.Metrics.Rejections.WithLabelValues("circuit_breaker", "flaky")); n != 1 {
		t.Errorf("rejections{circuit_breaker,flaky} = %v, want 1", n)
	}

	// Once open has passed, asking takes no probe: the request the body
	// follows is the probe, and closes the breaker.
	f.clk.Advance(5 * time.Second)
	up.status.Store(200)
	goesThrough("gamma", "the probe, after open")
	if r := f.do(t, "GET", "http://flaky.test/", map[string]string{"X-Tenant-Id": "gamma"}); r.status != 200 {
		t.Fatalf("after the probe: %+v, want the breaker closed", r)
	}
}

// TestMaxForwards: OPTIONS and TRACE end at the egress when Max-Forwards
// is 0 (answered without the upstream) and go on one lower otherwise.
func TestMaxForwards(t *testing.T) {
	up := fasttest.StartUpstream(t, fasttest.EchoMaxForwards)
	f := start(t, egressPolicy("  allow_unlisted: false", "targets:\n"+target("api", []string{"api.test"}, "http://"+up.Addr, "")), nil)
	fasttest.CheckMaxForwards(t, f.addr, "http://api.test/v1/things", "api.test", up, forwardedMethods)
}

// An upstream's response keeps the Date it came with, and one that came
// without gets the egress's (RFC 9110 §6.6.1).
func TestDate(t *testing.T) {
	up := fasttest.DateUpstream(t)
	f := start(t, egressPolicy("  allow_unlisted: false", "targets:\n"+target("api", []string{"api.test"}, up.URL, "")), nil)
	fasttest.CheckDate(t, f.addr, "http://api.test", "api.test")
}

// TestUnrequestedBytesNeverReachAnotherClient: an upstream that writes a
// second response nobody asked for after each answer; the next request,
// another client's, must get its own answer (issue 30: before every reuse
// was peeked at, a connection idle under 10 ms was reused unchecked, and
// the next client got the unrequested response).
func TestUnrequestedBytesNeverReachAnotherClient(t *testing.T) {
	up := fasttest.StartRogueUpstream(t)
	f := start(t, egressPolicy("  allow_unlisted: true", ""), nil)
	fasttest.CheckNoCrossedAnswers(t, f.addr, func(path string) string {
		return "GET http://" + up.Addr + path + " HTTP/1.1\r\nHost: " + up.Addr + "\r\n\r\n"
	}, up, f.gov.Metrics, "egress")
}
