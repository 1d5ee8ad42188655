package ingress

import (
	"bufio"
	"context"
	"fmt"
	"io"
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
	"github.com/warden-dev/warden/internal/testkit/loopback"
	"github.com/warden-dev/warden/proxy/clientwait"
	"github.com/warden-dev/warden/proxy/forward"
	"github.com/warden-dev/warden/proxy/splice"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, fasttest.LeakOptions()...) }

// t0 is mid-second so that a 1 s window has room on both sides.
var t0 = time.Date(2026, 3, 2, 10, 0, 0, 250_000_000, time.UTC)

type fixture struct {
	in     *Ingress
	gov    *fasttest.Governor
	worker *fasttest.Upstream
	addr   string
	clk    *clock.Fake
}

func policyFor(worker, tenant string) string {
	return fmt.Sprintf(`version: 1
ingress:
  listen: 127.0.0.1:0
  worker: http://%s
%s`, worker, tenant)
}

func start(t *testing.T, tenant string, h fasthttp.RequestHandler) *fixture {
	t.Helper()
	worker := fasttest.StartUpstream(t, h)
	f := startAt(t, tenant, worker.Addr)
	f.worker = worker
	return f
}

// startAt runs the ingress in front of a worker already listening at addr.
func startAt(t *testing.T, tenant, addr string) *fixture {
	t.Helper()
	f := &fixture{clk: clock.NewFake(t0)}
	gov, ctl := fasttest.NewGovernor(t, f.clk, policyFor(addr, tenant))
	f.gov = gov
	f.in = New(Options{Clock: f.clk, Metrics: gov.Metrics})
	if err := f.in.Apply(context.Background(), ctl); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := f.in.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	f.addr = f.in.Addr()
	return f
}

func (f *fixture) get(t *testing.T, path string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+f.addr+path, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func echoHeaders(ctx *fasthttp.RequestCtx) {
	for k, v := range ctx.Request.Header.All() {
		fmt.Fprintf(ctx, "%s: %s\n", strings.ToLower(string(k)), v)
	}
}

func TestForwardsAndStripsHopByHop(t *testing.T) {
	f := start(t, "", func(ctx *fasthttp.RequestCtx) {
		ctx.Response.Header.Set("Connection", "X-Worker-Hop")
		ctx.Response.Header.Set("X-Worker-Hop", "1")
		ctx.Response.Header.Set("Keep-Alive", "timeout=5")
		ctx.Response.Header.Set("Proxy-Authenticate", "Basic")
		ctx.Response.Header.Set("X-End-To-End", "kept")
		echoHeaders(ctx)
	})
	resp, body := fasttest.Raw(t, f.addr, "GET /echo?q=1 HTTP/1.1\r\nHost: svc\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\n"+
		"Keep-Alive: timeout=5\r\nProxy-Authorization: Basic x\r\nProxy-Connection: keep-alive\r\nTE: gzip\r\nTrailer: X-T\r\n"+
		"Upgrade: websocket\r\nX-Kept: yes\r\n\r\n")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	got := string(body)
	for _, gone := range []string{"connection:", "x-hop:", "keep-alive:", "proxy-authorization:", "proxy-connection:", "te:", "trailer:", "upgrade:"} {
		if strings.Contains(got, "\n"+gone) || strings.HasPrefix(got, gone) {
			t.Errorf("worker received %q:\n%s", gone, got)
		}
	}
	if !strings.Contains(got, "x-kept: yes") || !strings.Contains(got, "host: svc") {
		t.Errorf("end-to-end headers lost:\n%s", got)
	}
	id := ""
	for _, line := range strings.Split(got, "\n") {
		if v, ok := strings.CutPrefix(line, "x-request-id: "); ok {
			id = v
		}
	}
	if len(id) != 32 {
		t.Errorf("x-request-id %q not added", id)
	}
	for _, gone := range []string{"X-Worker-Hop", "Keep-Alive", "Proxy-Authenticate"} {
		if resp.Header.Get(gone) != "" {
			t.Errorf("client received %s", gone)
		}
	}
	if resp.Header.Get("X-End-To-End") != "kept" {
		t.Errorf("end-to-end response header lost: %v", resp.Header)
	}
	if f.worker.Paths()[0] != "/echo" {
		t.Errorf("worker path %v", f.worker.Paths())
	}

	// A request ID the caller chose is kept.
	_, body2 := f.get(t, "/", map[string]string{"X-Request-Id": "caller-id"})
	if !strings.Contains(body2, "x-request-id: caller-id\n") || strings.Count(body2, "x-request-id") != 1 {
		t.Errorf("caller's x-request-id not kept:\n%s", body2)
	}
	// An empty one is none: the request is given one.
	_, body3 := fasttest.Raw(t, f.addr, "GET / HTTP/1.1\r\nHost: svc\r\nX-Request-Id:\r\nConnection: close\r\n\r\n")
	if i := strings.Index(string(body3), "x-request-id: "); i < 0 || len(strings.SplitN(string(body3)[i+len("x-request-id: "):], "\n", 2)[0]) != 32 || strings.Count(string(body3), "x-request-id") != 1 {
		t.Errorf("an empty x-request-id was not replaced by one of warden's:\n%s", body3)
	}
	if n := fasttest.Value(f.gov.Metrics.Requests.WithLabelValues("ingress", "worker", "200")); n != 3 {
		t.Errorf("warden_requests_total{ingress,worker,200} = %v, want 3", n)
	}
}

// TestForwardedHeaders: the worker learns the address the request came
// from, after any chain the client brought, and the scheme.
func TestForwardedHeaders(t *testing.T) {
	f := start(t, "", echoHeaders)
	tests := []struct {
		name, headers, wantFor, wantProto string
	}{
		{"no chain", "", "127.0.0.1", "http"},
		{"chain appended", "X-Forwarded-For: 203.0.113.1\r\nX-Forwarded-Proto: https\r\n", "203.0.113.1, 127.0.0.1", "https"},
		{"lines joined", "X-Forwarded-For: 203.0.113.1\r\nX-Forwarded-For: 198.51.100.2\r\n", "203.0.113.1, 198.51.100.2, 127.0.0.1", "http"},
		// Named in Connection, the client's chain is hop-by-hop: dropped.
		{"hop-by-hop chain", "Connection: X-Forwarded-For\r\nX-Forwarded-For: 203.0.113.1\r\n", "127.0.0.1", "http"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := fasttest.Raw(t, f.addr, "GET / HTTP/1.1\r\nHost: svc\r\n"+tc.headers+"Connection: close\r\n\r\n")
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			got := "\n" + string(body)
			if want := "\nx-forwarded-for: " + tc.wantFor + "\n"; !strings.Contains(got, want) || strings.Count(got, "x-forwarded-for:") != 1 {
				t.Errorf("worker did not get one %q:%s", want[1:], got)
			}
			if want := "\nx-forwarded-proto: " + tc.wantProto + "\n"; !strings.Contains(got, want) || strings.Count(got, "x-forwarded-proto:") != 1 {
				t.Errorf("worker did not get one %q:%s", want[1:], got)
			}
		})
	}
}

// TestContentTypePassedAsSent: a body without a Content-Type reaches the
// worker without one (fasthttp would add application/octet-stream), and
// one the client set is kept.
func TestContentTypePassedAsSent(t *testing.T) {
	f := start(t, "", echoHeaders)
	tests := []struct{ name, req, want string }{
		{"length, none", "POST / HTTP/1.1\r\nHost: w\r\nContent-Length: 3\r\n\r\nabc", ""},
		{"chunked, none", "POST / HTTP/1.1\r\nHost: w\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", ""},
		{"length, set", "POST / HTTP/1.1\r\nHost: w\r\nContent-Type: text/csv\r\nContent-Length: 3\r\n\r\nabc", "text/csv"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := fasttest.Raw(t, f.addr, tt.req)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			got := ""
			for _, line := range strings.Split(string(body), "\n") {
				if v, ok := strings.CutPrefix(line, "content-type: "); ok {
					got = v
				}
			}
			if got != tt.want {
				t.Fatalf("worker saw Content-Type %q, want %q:\n%s", got, tt.want, body)
			}
		})
	}
}

func TestAbsoluteFormBecomesOriginForm(t *testing.T) {
	f := start(t, "", func(ctx *fasthttp.RequestCtx) { ctx.Write(ctx.Request.Header.RequestURI()) })
	_, body := fasttest.Raw(t, f.addr, "GET http://svc/a/b?c=d HTTP/1.1\r\nHost: svc\r\n\r\n")
	if string(body) != "/a/b?c=d" {
		t.Fatalf("worker saw %q", body)
	}
	_, body = fasttest.Raw(t, f.addr, "GET http://svc?x HTTP/1.1\r\nHost: svc\r\n\r\n")
	if string(body) != "/?x" {
		t.Fatalf("worker saw %q", body)
	}
	// The request-target's authority wins over a differing Host (RFC 9112
	// §3.2.2), so the worker and warden's checks see one host.
	f = start(t, "", func(ctx *fasthttp.RequestCtx) { ctx.Write(ctx.Request.Header.Host()) })
	_, body = fasttest.Raw(t, f.addr, "GET http://svc/a HTTP/1.1\r\nHost: other\r\n\r\n")
	if string(body) != "svc" {
		t.Fatalf("worker saw Host %q, want the request-target's", body)
	}
}

func TestTenantCap(t *testing.T) {
	f := start(t, `  tenant: { header: x-tenant-id, rate: 3, window: 1 }
  tenants: { acme: { rate: 5, window: 60 } }`, func(ctx *fasthttp.RequestCtx) {})
	for i := range 3 {
		if resp, body := f.get(t, "/", map[string]string{"X-Tenant-Id": "globex"}); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i+1, resp.StatusCode, body)
		}
	}
	resp, body := f.get(t, "/", map[string]string{"X-Tenant-Id": "globex"})
	if resp.StatusCode != 429 {
		t.Fatalf("4th request: %d", resp.StatusCode)
	}
	want := map[string]string{
		"Retry-After": "1", "Ratelimit-Limit": "3", "Ratelimit-Remaining": "0", "Ratelimit-Reset": "1",
		"X-Warden-Control": "tenant_rate", "Content-Type": "application/json",
	}
	for k, v := range want {
		if got := resp.Header.Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	if wantBody := `{"control":"tenant_rate","quota":"tenant:globex","limit":3,"current":4,"retryAfterSeconds":1}`; body != wantBody {
		t.Errorf("body %s\nwant %s", body, wantBody)
	}
	// On the wire the names are spelt as SPEC §4 spells them.
	head := fasttest.RawHead(t, f.addr, "GET / HTTP/1.1\r\nHost: w\r\nX-Tenant-Id: globex\r\n\r\n")
	for _, line := range []string{"\r\nRateLimit-Limit: 3\r\n", "\r\nRateLimit-Remaining: 0\r\n", "\r\nRateLimit-Reset: ", "\r\nRetry-After: ", "\r\nx-warden-control: tenant_rate\r\n"} {
		if !strings.Contains(head, line) {
			t.Errorf("429 head has no %q:\n%s", line, head)
		}
	}
	if n := f.worker.Requests.Load(); n != 3 {
		t.Errorf("worker saw %d requests, want 3", n)
	}
	// Another tenant has its own window; an override applies.
	for i := range 5 {
		if resp, _ := f.get(t, "/", map[string]string{"X-Tenant-Id": "acme"}); resp.StatusCode != 200 {
			t.Fatalf("acme request %d refused", i+1)
		}
	}
	resp, body = f.get(t, "/", map[string]string{"X-Tenant-Id": "acme"})
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "60" || !strings.Contains(body, `"limit":5,"current":6,"retryAfterSeconds":60`) {
		t.Errorf("acme over its override: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	// Requests without the header share the bucket named by the header.
	for range 3 {
		f.get(t, "/", nil)
	}
	resp, body = f.get(t, "/", nil)
	if resp.StatusCode != 429 || !strings.Contains(body, `"quota":"tenant:header:x-tenant-id"`) {
		t.Errorf("anonymous over the cap: %d %s", resp.StatusCode, body)
	}
	// The next window admits again.
	f.clk.Advance(time.Second)
	if resp, _ := f.get(t, "/", map[string]string{"X-Tenant-Id": "globex"}); resp.StatusCode != 200 {
		t.Errorf("next window refused: %d", resp.StatusCode)
	}
	// globex twice (once read raw), acme once, the anonymous bucket once.
	if n := fasttest.Value(f.gov.Metrics.Rejections.WithLabelValues("tenant_rate", "ingress")); n != 4 {
		t.Errorf("warden_rejections_total{tenant_rate,ingress} = %v, want 4", n)
	}
}

// Tenants first seen beyond max_keys share the overflow window: its 429
// names quota tenant_overflow with a tenant 429's headers, and each
// request it counts is counted in warden_tenant_overflow_total.
func TestTenantOverflow(t *testing.T) {
	f := start(t, `  tenant: { header: x-tenant-id, rate: 1, window: 1, max_keys: 2 }`, func(ctx *fasthttp.RequestCtx) {})
	for _, tenant := range []string{"a", "b", "c"} {
		if resp, body := f.get(t, "/", map[string]string{"X-Tenant-Id": tenant}); resp.StatusCode != 200 {
			t.Fatalf("tenant %s: %d %s", tenant, resp.StatusCode, body)
		}
	}
	resp, body := f.get(t, "/", map[string]string{"X-Tenant-Id": "d"})
	if resp.StatusCode != 429 {
		t.Fatalf("tenant d after the overflow window's one request: %d %s", resp.StatusCode, body)
	}
	for k, v := range map[string]string{"Retry-After": "1", "Ratelimit-Limit": "1", "Ratelimit-Remaining": "0",
		"Ratelimit-Reset": "1", "X-Warden-Control": "tenant_rate"} {
		if got := resp.Header.Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	if want := `{"control":"tenant_rate","quota":"tenant_overflow","limit":1,"current":2,"retryAfterSeconds":1}`; body != want {
		t.Errorf("body %s\nwant %s", body, want)
	}
	if resp, _ := f.get(t, "/", map[string]string{"X-Tenant-Id": "a"}); resp.StatusCode != 429 || resp.Header.Get("Ratelimit-Limit") != "1" {
		t.Errorf("tenant a, held in the window, past its own rate: %d", resp.StatusCode)
	}
	if n := fasttest.Value(f.gov.Metrics.TenantOverflow.WithLabelValues("ingress")); n != 2 {
		t.Errorf("warden_tenant_overflow_total{ingress} = %v, want 2 (c and d)", n)
	}
}

// A fail_closed shared backend that is down refuses with control upstream
// (SPEC §9), in the header, the body and the metric label alike.
func TestBackendDownRefusesWithUpstream(t *testing.T) {
	clk := clock.NewFake(t0)
	worker := fasttest.StartUpstream(t, func(ctx *fasthttp.RequestCtx) {})
	g, ctl := fasttest.NewGovernorBackendDown(t, clk, policyFor(worker.Addr, "  tenant: { header: x-tenant-id, rate: 3, window: 1 }"))
	m := g.Metrics
	in := New(Options{Clock: clk, Metrics: m})
	if err := in.Apply(context.Background(), ctl); err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		in.Shutdown(ctx)
	}()
	f := &fixture{in: in, gov: g, worker: worker, addr: in.Addr(), clk: clk}
	resp, body := f.get(t, "/", map[string]string{"X-Tenant-Id": "acme"})
	if resp.StatusCode != 429 || resp.Header.Get("X-Warden-Control") != "upstream" || !strings.Contains(body, `"control":"upstream"`) {
		t.Fatalf("backend down: %d control %q body %s", resp.StatusCode, resp.Header.Get("X-Warden-Control"), body)
	}
	// A refusal that counted nothing reports no quota: retry in a second.
	if resp.Header.Get("RateLimit-Limit") != "" || resp.Header.Get("RateLimit-Remaining") != "" || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("backend down: headers %v", resp.Header)
	}
	if n := fasttest.Value(m.Rejections.WithLabelValues("upstream", "ingress")); n != 1 {
		t.Fatalf("warden_rejections_total{upstream,ingress} = %v, want 1", n)
	}
	if n := worker.Requests.Load(); n != 0 {
		t.Fatalf("worker saw %d requests while the backend was down", n)
	}
}

// TestSmugglingRefused sends each ambiguous request over raw TCP, each
// followed by a pipelined request a smuggler would hide in the body: the
// answer is 400, the connection closes, and the worker sees nothing.
func TestSmugglingRefused(t *testing.T) {
	f := start(t, "", func(ctx *fasthttp.RequestCtx) {
		if s := ctx.RequestBodyStream(); s != nil {
			_, _ = io.Copy(io.Discard, s)
		}
	})
	smuggled := "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
	tests := []struct{ name, req string }{
		{"CL and TE", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"},
		{"TE and CL", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n"},
		{"TE identity and CL", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\nContent-Length: 5\r\n\r\nhello"},
		{"duplicate CL", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello"},
		{"conflicting CL", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 41\r\n\r\nhello"},
		{"CL list", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 5\r\n\r\nhello"},
		{"CL plus sign", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: +5\r\n\r\nhello"},
		{"TE gzip chunked", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n"},
		{"TE twice", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"},
		{"TE with space before colon", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n"},
		{"TE obs-fold", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n"},
		{"obs-fold", "GET / HTTP/1.1\r\nHost: x\r\nX-A: b\r\n c\r\n\r\n"},
		{"bare LF", "GET / HTTP/1.1\r\nHost: x\nX-A: b\r\n\r\n"},
		{"space in name", "GET / HTTP/1.1\r\nHost: x\r\nX A: b\r\n\r\n"},
		{"NUL in value", "GET / HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n"},
		{"two hosts", "GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n"},
		{"no host", "GET / HTTP/1.1\r\nX-A: b\r\n\r\n"},
		{"TE in HTTP/1.0", "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"},
		{"bad chunk size", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n"},
		{"negative chunk size", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n0\r\n\r\n"},
		{"chunk without CRLF", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n"},
		{"chunk size overflow", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffffff\r\nhello\r\n0\r\n\r\n"},
	}
	refused := func() float64 {
		return fasttest.Value(f.gov.Metrics.Requests.WithLabelValues("ingress", "worker", "400"))
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before, counted := f.worker.Requests.Load(), refused()
			c, err := net.Dial("tcp", f.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			io.WriteString(c, tc.req+smuggled)
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("no response: %v", err)
			}
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 400 || !strings.HasPrefix(string(body), `{"error":`) {
				t.Fatalf("status %d %q, want 400 with warden's JSON", resp.StatusCode, body)
			}
			// Counted, whether warden's handler or the listener (a request
			// fasthttp could not parse) answered it.
			fasttest.WaitFor(t, "the 400 counted", func() bool { return refused() == counted+1 })
			// Nothing more comes back: the connection is closed, so the
			// pipelined request is never read.
			if extra, err := br.ReadString('\n'); err == nil {
				t.Fatalf("connection kept serving: %q", extra)
			}
			if n := f.worker.Requests.Load() - before; n != 0 {
				t.Fatalf("worker saw %d requests: %v", n, f.worker.Paths())
			}
		})
	}
}

func TestChunkedAndLargeBodies(t *testing.T) {
	f := start(t, "", func(ctx *fasthttp.RequestCtx) {
		n, err := io.Copy(io.Discard, ctx.RequestBodyStream())
		if err != nil {
			ctx.SetStatusCode(500)
		}
		fmt.Fprintf(ctx, "%d %s", n, ctx.Request.Header.Peek("Content-Length"))
	})
	// A small chunked body is re-framed with a length.
	_, body := fasttest.Raw(t, f.addr, "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
	if string(body) != "11 11" {
		t.Fatalf("small chunked: worker read %q", body)
	}
	// A long one streams on in chunks.
	c, err := net.Dial("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	go func() {
		w := bufio.NewWriter(c)
		io.WriteString(w, "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
		chunk := strings.Repeat("x", 10000)
		for range 50 {
			fmt.Fprintf(w, "%x\r\n%s\r\n", len(chunk), chunk)
		}
		io.WriteString(w, "0\r\n\r\n")
		w.Flush()
	}()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if string(b) != "500000 " {
		t.Fatalf("long chunked: worker read %q", b)
	}
}

func TestWorkerDown(t *testing.T) {
	f := start(t, "", func(ctx *fasthttp.RequestCtx) {})
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := ln.Addr().String()
	ln.Close()
	if err := f.in.Apply(context.Background(), f.gov.Load(t, policyFor(dead, ""))); err != nil {
		t.Fatal(err)
	}
	// Apply kept the listener (same listen key), so the address is unchanged.
	resp, body := f.get(t, "/", nil)
	if resp.StatusCode != 502 || resp.Header.Get("X-Warden-Control") != "upstream" || !strings.Contains(body, `"control":"upstream","target":"worker"`) {
		t.Fatalf("worker down: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	if n := fasttest.Value(f.gov.Metrics.Rejections.WithLabelValues("upstream", "worker")); n != 1 {
		t.Errorf("warden_rejections_total{upstream,worker} = %v", n)
	}
}

func TestMount(t *testing.T) {
	f := start(t, "  tenant: { rate: 2, window: 60 }", func(ctx *fasthttp.RequestCtx) { ctx.WriteString("worker") })
	f.in.Mount("/v1/runs", func(ctx *fasthttp.RequestCtx) {
		fmt.Fprintf(ctx, "runs %s %s", ctx.Path(), ctx.PostBody())
	}, 1<<20)
	post := func(path, body string) (int, string) {
		resp, err := http.Post("http://"+f.addr+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		// The run API's answers, its refusals and the worker's (which
		// sends none) all carry a Date.
		if d := resp.Header.Values("Date"); len(d) != 1 {
			t.Errorf("%s: Date %q, want one", path, d)
		}
		return resp.StatusCode, string(b)
	}
	if st, b := post("/v1/runs", `{"name":"x"}`); st != 200 || b != `runs /v1/runs {"name":"x"}` {
		t.Fatalf("POST /v1/runs: %d %s", st, b)
	}
	if st, b := post("/v1/runsx", ""); st != 200 || b != "worker" {
		t.Fatalf("/v1/runsx went to %d %s", st, b)
	}
	// The tenant cap applies to the run API like to everything else, and
	// its refusal is counted under the run API's target.
	if st, b := post("/v1/runs/abc", ""); st != 429 || !strings.Contains(b, "tenant_rate") {
		t.Fatalf("third request: %d %s", st, b)
	}
	for target, want := range map[string]float64{"scheduler": 1, "worker": 0} {
		if n := fasttest.Value(f.gov.Metrics.Requests.WithLabelValues("ingress", target, "429")); n != want {
			t.Errorf("warden_requests_total{ingress,%s,429} = %v, want %v", target, n, want)
		}
	}
}

// The mounted handler's body limit is the one Mount was given: a body up
// to it reaches the handler whole, and one over it is a 400 (never a 413:
// the run API refuses only with 400s and the tenant 429) with a JSON error
// naming the limit, whether the body was announced too large (refused
// before it is read, beyond the 8 KiB fasthttp reads ahead before any
// handler runs) or found too large while reading it (chunked).
func TestMountBodyLimit(t *testing.T) {
	const limit = 3 << 20 // over fasthttp's and the old mount's defaults
	f := start(t, "", func(ctx *fasthttp.RequestCtx) {})
	f.in.Mount("/v1/runs", func(ctx *fasthttp.RequestCtx) {
		ctx.SetStatusCode(202)
		fmt.Fprintf(ctx, "%d", len(ctx.PostBody()))
	}, limit)
	chunked := func(n int) string {
		var b strings.Builder
		for rest := n; rest > 0; {
			c := min(rest, 64<<10)
			fmt.Fprintf(&b, "%x\r\n%s\r\n", c, strings.Repeat("x", c))
			rest -= c
		}
		return "POST /v1/runs HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + b.String() + "0\r\n\r\n"
	}
	tests := []struct {
		name string
		raw  string
		code int
		body string // the handler's answer, or a substring of the refusal
	}{
		{"at the limit", fmt.Sprintf("POST /v1/runs HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", limit, strings.Repeat("x", limit)),
			202, fmt.Sprint(limit)},
		{"chunked at the limit", chunked(limit), 202, fmt.Sprint(limit)},
		{"announced over the limit", fmt.Sprintf("POST /v1/runs HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", limit+1, strings.Repeat("x", 8<<10)),
			400, fmt.Sprintf(`{"error":"body is %d bytes; the limit is %d"}`, limit+1, limit)},
		{"chunked over the limit", chunked(limit + 1), 400, fmt.Sprintf(`{"error":"body is over %d bytes; the limit is %d"}`, limit, limit)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := fasttest.Raw(t, f.addr, tc.raw)
			if resp.StatusCode != tc.code || string(body) != tc.body {
				t.Fatalf("%d %s, want %d %s", resp.StatusCode, body, tc.code, tc.body)
			}
			if tc.code == 400 && resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("refusal Content-Type %q, want application/json", resp.Header.Get("Content-Type"))
			}
		})
	}
	// The refusal of a body announced too large comes at once, while the
	// client has sent only part of it: the rest is read and dropped after
	// the answer (a lingering close), not before it. Read first, the
	// client would wait out the linger's 5 s for the answer; the read here
	// gives up well before.
	c, err := net.Dial("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /v1/runs HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", limit+1, strings.Repeat("x", 8<<10))
	_ = c.SetReadDeadline(time.Now().Add(splice.LingerTime / 2))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != 400 || !resp.Close {
		t.Fatalf("answer while the body is still owed: %v %v, want the 400 closing the connection", resp, err)
	}
}

func TestGracefulDrain(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	defer unblock()
	entered := make(chan struct{})
	f := start(t, "", func(ctx *fasthttp.RequestCtx) {
		close(entered)
		<-release
		ctx.WriteString("finished")
	})
	type result struct {
		status int
		body   string
		err    error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := http.Get("http://" + f.addr + "/slow")
		if err != nil {
			done <- result{err: err}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- result{status: resp.StatusCode, body: string(b)}
	}()
	<-entered
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		shut <- f.in.Shutdown(ctx)
	}()
	// The listener stops accepting while the request is in flight.
	fasttest.WaitFor(t, "listener closed", func() bool {
		c, err := net.DialTimeout("tcp", f.addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	unblock()
	r := <-done
	if r.err != nil || r.status != 200 || r.body != "finished" {
		t.Fatalf("in-flight request: %+v", r)
	}
	if err := <-shut; err != nil {
		t.Fatalf("shutdown: %v", err)
	}
}

func TestDrainDeadlineCutsStragglers(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{})
	var once sync.Once
	f := start(t, "", func(ctx *fasthttp.RequestCtx) {
		once.Do(func() { close(entered) })
		<-release
	})
	defer close(release)
	errc := make(chan error, 1)
	go func() {
		resp, err := http.Get("http://" + f.addr + "/stuck")
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	<-entered
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := f.in.Shutdown(ctx); err == nil {
		t.Fatal("shutdown past its deadline reported success")
	}
	if err := <-errc; err == nil {
		t.Fatal("straggler got a response after the deadline cut it")
	}
}

func TestReloadMovesListener(t *testing.T) {
	f := start(t, "", func(ctx *fasthttp.RequestCtx) { ctx.WriteString("ok") })
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	next := ln.Addr().String()
	ln.Close()
	yaml := strings.Replace(policyFor(f.worker.Addr, ""), "127.0.0.1:0", next, 1)
	if err := f.in.Apply(context.Background(), f.gov.Load(t, yaml)); err != nil {
		t.Fatal(err)
	}
	if f.in.Addr() != next {
		t.Fatalf("listener at %s, want %s", f.in.Addr(), next)
	}
	f.addr = next
	if resp, body := f.get(t, "/", nil); resp.StatusCode != 200 || body != "ok" {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	// Removing the section stops the listener.
	if err := f.in.Apply(context.Background(), f.gov.Load(t, "version: 1\n")); err != nil {
		t.Fatal(err)
	}
	if f.in.Addr() != "" {
		t.Fatal("listener still bound without an ingress section")
	}
}

// TestFailedRebindKeepsWorkerPool: a reload that moves the listener to an
// address already taken fails as a whole; in particular the worker pool,
// which the reload's new worker would replace, still serves the running
// policy.
func TestFailedRebindKeepsWorkerPool(t *testing.T) {
	f := start(t, "", func(ctx *fasthttp.RequestCtx) { ctx.WriteString("old worker") })
	other := fasttest.StartUpstream(t, func(ctx *fasthttp.RequestCtx) { ctx.WriteString("new worker") })
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	old := f.in.rt.Load().worker
	yaml := strings.Replace(policyFor(other.Addr, ""), "127.0.0.1:0", taken.Addr().String(), 1)
	if err := f.in.Apply(context.Background(), f.gov.Load(t, yaml)); err == nil {
		t.Fatal("a reload onto a taken address succeeded")
	}
	if f.in.rt.Load().worker != old || f.in.Addr() != f.addr {
		t.Fatal("the failed reload swapped the policy or the listener")
	}
	if f.in.pools.Lookup([]byte("worker")) != old {
		t.Fatal("the failed reload replaced the worker pool")
	}
	if resp, body := f.get(t, "/", nil); resp.StatusCode != 200 || body != "old worker" {
		t.Fatalf("after the failed reload: %d %s", resp.StatusCode, body)
	}
	// A closed pool would not keep the connection for reuse.
	if old.Stats().Open == 0 {
		t.Fatal("the worker pool no longer keeps its connections")
	}
}

// TestHTTP10ClientGetsALength: a response of unknown length goes to an
// HTTP/1.0 client with a Content-Length (it does not know chunked), and to
// an HTTP/1.1 client chunked as before.
func TestHTTP10ClientGetsALength(t *testing.T) {
	body := strings.Repeat("0123456789", 10_000) // 100 kB, streamed
	f := start(t, "", func(ctx *fasthttp.RequestCtx) {
		ctx.SetBodyStream(strings.NewReader(body), -1) // chunked
	})
	tests := []struct{ name, req, framing string }{
		{"HTTP/1.0", "GET / HTTP/1.0\r\nHost: w\r\n\r\n", "content-length: 100000"},
		{"HTTP/1.1", "GET / HTTP/1.1\r\nHost: w\r\nConnection: close\r\n\r\n", "transfer-encoding: chunked"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			head := strings.ToLower(fasttest.RawHead(t, f.addr, tt.req))
			if !strings.Contains(head, tt.framing) {
				t.Fatalf("want %q in:\n%s", tt.framing, head)
			}
			if tt.name == "HTTP/1.0" && strings.Contains(head, "transfer-encoding") {
				t.Fatalf("an HTTP/1.0 client was sent Transfer-Encoding:\n%s", head)
			}
			resp, got := fasttest.Raw(t, f.addr, tt.req)
			if resp.StatusCode != 200 || string(got) != body {
				t.Fatalf("status %d, %d bytes of body, want 200 and %d", resp.StatusCode, len(got), len(body))
			}
		})
	}
	// Past forward.HTTP10BodyMax: a 502, counted as the worker's refusal. A
	// raw worker, since fasthttp's would frame its answer to an HTTP/1.0
	// request with a length.
	long := startAt(t, "", loopback.Serve(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			if l, err := br.ReadString('\n'); err != nil || l == "\r\n" {
				break
			}
		}
		bw := bufio.NewWriter(c)
		bw.WriteString("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n") // ends when the worker closes
		io.Copy(bw, io.LimitReader(zeros{}, forward.HTTP10BodyMax+1))
		bw.Flush()
	}))
	resp, _ := fasttest.Raw(t, long.addr, "GET / HTTP/1.0\r\nHost: w\r\n\r\n")
	if resp.StatusCode != 502 || resp.Header.Get("X-Warden-Control") != "upstream" {
		t.Fatalf("HTTP/1.0, too long: %d %v", resp.StatusCode, resp.Header)
	}
	if n := fasttest.Value(long.gov.Metrics.Rejections.WithLabelValues("upstream", "worker")); n != 1 {
		t.Fatalf("rejections{upstream,worker} = %v", n)
	}
}

// zeros reads as an endless run of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// TestRequestTrailersDropped: a chunked request's trailer fields are
// dropped, and the request the worker gets announces none.
func TestRequestTrailersDropped(t *testing.T) {
	f := start(t, "", echoHeaders)
	resp, body := fasttest.Raw(t, f.addr, "POST / HTTP/1.1\r\nHost: w\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"+
		"3\r\nabc\r\n0\r\nX-Trailer: tv\r\n\r\n")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	for _, gone := range []string{"trailer:", "x-trailer:"} {
		if strings.Contains(string(body), "\n"+gone) || strings.HasPrefix(string(body), gone) {
			t.Errorf("the worker saw %q:\n%s", gone, body)
		}
	}
	if !strings.Contains(string(body), "content-length: 3") {
		t.Errorf("the body did not go on with its length:\n%s", body)
	}
}

// TestWorkersVersionNotPassedOn: the status line carries warden's HTTP/1.1
// whatever the worker's version. A close-delimited HTTP/1.0 answer goes to
// an HTTP/1.1 client chunked, which an "HTTP/1.0" status line would forbid:
// the client would read the chunk framing as the body.
func TestWorkersVersionNotPassedOn(t *testing.T) {
	for _, version := range []string{"HTTP/1.0", "HTTP/1.1"} {
		t.Run(version, func(t *testing.T) {
			f := startAt(t, "", loopback.Serve(t, func(c net.Conn) {
				br := bufio.NewReader(c)
				for {
					if l, err := br.ReadString('\n'); err != nil || l == "\r\n" {
						break
					}
				}
				io.WriteString(c, version+" 200 OK\r\nContent-Type: text/plain\r\n\r\nclose-delimited body") // ends when the worker closes
			}))
			head := fasttest.RawHead(t, f.addr, "GET / HTTP/1.1\r\nHost: w\r\nConnection: close\r\n\r\n")
			if !strings.HasPrefix(head, "HTTP/1.1 200") {
				t.Fatalf("status line of the answer to an HTTP/1.1 client:\n%s", head)
			}
			resp, got := fasttest.Raw(t, f.addr, "GET / HTTP/1.1\r\nHost: w\r\nConnection: close\r\n\r\n")
			if resp.StatusCode != 200 || string(got) != "close-delimited body" {
				t.Fatalf("status %d, body %q", resp.StatusCode, got)
			}
		})
	}
}

// TestConnectRefused: the ingress is a reverse proxy and opens no tunnels.
// Passed on, the worker's 2xx would tell the client that its connection
// had become one.
func TestConnectRefused(t *testing.T) {
	f := start(t, "", func(ctx *fasthttp.RequestCtx) { ctx.WriteString("worker") })
	resp, _ := fasttest.Raw(t, f.addr, "CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\n\r\n")
	if resp.StatusCode != 405 || resp.Header.Get("Allow") == "" || !resp.Close {
		t.Fatalf("CONNECT at the ingress: %d %v (close %v), want 405 with Allow, closing", resp.StatusCode, resp.Header, resp.Close)
	}
	if n := len(f.worker.Paths()); n != 0 {
		t.Fatalf("the worker received %d requests", n)
	}
}

// TestTwoTenantHeadersRefused: a request names one tenant. With two tenant
// headers the cap would count the first while the worker might read the
// last (or both joined), so the request is refused before either.
func TestTwoTenantHeadersRefused(t *testing.T) {
	f := start(t, "  tenant: { rate: 5, window: 60 }", func(ctx *fasthttp.RequestCtx) { ctx.WriteString("worker") })
	resp, body := fasttest.Raw(t, f.addr, "GET / HTTP/1.1\r\nHost: w\r\nX-Tenant-Id: someone-else\r\nX-Tenant-Id: capped\r\n\r\n")
	if resp.StatusCode != 400 || !strings.Contains(string(body), "more than one x-tenant-id header") {
		t.Fatalf("%d %s, want 400 naming the header", resp.StatusCode, body)
	}
	if n := len(f.worker.Paths()); n != 0 {
		t.Fatalf("the worker received %d requests", n)
	}
}

// TestWorkerTimeout: with ingress.timeout a worker that does not answer
// in time gets the caller a 504 timeout, counted as a timeout rejection;
// without it the exchange is not bounded.
func TestWorkerTimeout(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	f := start(t, "  timeout: 200ms", func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) == "/slow" {
			<-release
		}
		ctx.WriteString("worker")
	})
	resp, body := fasttest.Raw(t, f.addr, "GET /slow HTTP/1.1\r\nHost: w\r\nConnection: close\r\n\r\n")
	if resp.StatusCode != 504 || resp.Header.Get("X-Warden-Control") != "timeout" {
		t.Fatalf("%d %v %s, want 504 timeout", resp.StatusCode, resp.Header, body)
	}
	if n := fasttest.Value(f.gov.Metrics.Rejections.WithLabelValues("timeout", "worker")); n != 1 {
		t.Errorf("rejections{timeout,worker} = %v, want 1", n)
	}
	if resp, _ := fasttest.Raw(t, f.addr, "GET /fast HTTP/1.1\r\nHost: w\r\nConnection: close\r\n\r\n"); resp.StatusCode != 200 {
		t.Errorf("a prompt answer: %d", resp.StatusCode)
	}
}

// TestVersionNotHTTP1Refused: a request line's version other than HTTP/1.x
// gets 505; fasthttp would read it as HTTP/1.0 and the worker receive it
// verbatim (HTTP/2.0 needs no Host).
func TestVersionNotHTTP1Refused(t *testing.T) {
	f := start(t, "", func(ctx *fasthttp.RequestCtx) { ctx.WriteString("worker") })
	for _, tc := range []struct {
		line string
		code int
	}{
		{"GET / HTTP/2.0", 505},
		{"GET / HTTP/3.0", 505},
		{"GET / HTTP/1.0", 200},
	} {
		resp, _ := fasttest.Raw(t, f.addr, tc.line+"\r\nHost: w\r\nConnection: close\r\n\r\n")
		if resp.StatusCode != tc.code {
			t.Errorf("%s: %d, want %d", tc.line, resp.StatusCode, tc.code)
		}
	}
	if n := len(f.worker.Paths()); n != 1 {
		t.Errorf("the worker received %d requests, want 1", n)
	}
}

// A request that asks before sending its body (Expect: 100-continue) is
// checked before it is told to go on: one its tenant may not send gets
// the 429 instead of a 100 Continue, and uploads nothing. One that may is
// counted once, not again when its body arrives.
func TestExpectContinueCheckedBeforeTheBody(t *testing.T) {
	f := start(t, `  tenant: { header: x-tenant-id, rate: 2, window: 60 }`, func(ctx *fasthttp.RequestCtx) {
		ctx.SetBody(ctx.Request.Body())
	})
	ask := func(length int) (*http.Response, *bufio.Reader, net.Conn) {
		t.Helper()
		return fasttest.FirstAnswer(t, f.addr, fmt.Sprintf("POST / HTTP/1.1\r\nHost: w\r\nX-Tenant-Id: acme\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n", length))
	}

	resp, br, c := ask(5)
	if resp.StatusCode != http.StatusContinue {
		t.Fatalf("first request, within the cap: %d, want 100 Continue", resp.StatusCode)
	}
	io.WriteString(c, "hello")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(body) != "hello" {
		t.Fatalf("first request: %d %q", resp.StatusCode, body)
	}
	if resp, _ := f.get(t, "/", map[string]string{"X-Tenant-Id": "acme"}); resp.StatusCode != 200 {
		t.Fatalf("second request, the cap's last: %d (the first was counted twice?)", resp.StatusCode)
	}

	resp, _, _ = ask(10 << 20)
	body, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != 429 || resp.Header.Get("X-Warden-Control") != "tenant_rate" ||
		string(body) != `{"control":"tenant_rate","quota":"tenant:acme","limit":2,"current":3,"retryAfterSeconds":60}` {
		t.Fatalf("over the cap: %d %v %s, want the tenant's 429 before the body", resp.StatusCode, resp.Header, body)
	}
	if n := f.worker.Requests.Load(); n != 2 {
		t.Errorf("worker saw %d requests, want 2", n)
	}
}

// TestClientLeavingClosesTheWorkerExchange: when a client hangs up while
// the worker has not answered, the next client check gives the exchange
// up: the connection to the worker is closed (the worker sees its end)
// and the request is counted as 499, as nginx counts it.
func TestClientLeavingClosesTheWorkerExchange(t *testing.T) {
	// Buffered past the one connection expected, so that a handler for an
	// unexpected second one cannot block the cleanup.
	workerSaw := make(chan string, 4)
	workerEOF := make(chan error, 4)
	worker := loopback.Serve(t, func(c net.Conn) {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		br := bufio.NewReader(c)
		line, _ := br.ReadString('\n')
		workerSaw <- line
		// The request's head, then nothing: the worker never answers.
		_, err := io.Copy(io.Discard, br)
		workerEOF <- err
	})
	f := startAt(t, "", worker)

	c, err := net.Dial("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(c, "GET /slow HTTP/1.1\r\nHost: w\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if line := <-workerSaw; !strings.HasPrefix(line, "GET /slow ") {
		t.Fatalf("worker saw %q", line)
	}
	f.clk.Advance(clientwait.CheckInterval) // the client is still there
	select {
	case err := <-workerEOF:
		t.Fatalf("the exchange was given up with its client still there (%v)", err)
	default:
	}
	c.Close()
	gone := f.gov.Metrics.Requests.WithLabelValues("ingress", "worker", "499")
	fasttest.WaitFor(t, "the exchange given up", func() bool {
		f.clk.Advance(clientwait.CheckInterval)
		return fasttest.Value(gone) == 1
	})
	if err := <-workerEOF; err != nil {
		t.Fatalf("the worker's connection was not closed: %v", err)
	}
}

// TestMaxForwards: OPTIONS and TRACE end at the ingress when Max-Forwards
// is 0 (answered without the worker) and go on one lower otherwise.
func TestMaxForwards(t *testing.T) {
	f := start(t, "", fasttest.EchoMaxForwards)
	fasttest.CheckMaxForwards(t, f.addr, "/v1/things", "worker.test", f.worker, forwardedMethods)
}

// A worker's response keeps the Date it came with, and one that came
// without gets the ingress's (RFC 9110 §6.6.1).
func TestDate(t *testing.T) {
	up := fasttest.DateUpstream(t)
	f := startAt(t, "", strings.TrimPrefix(up.URL, "http://"))
	fasttest.CheckDate(t, f.addr, "", "worker.test")
}

// TestUnrequestedBytesNeverReachAnotherClient: a worker that writes a
// second response nobody asked for after each answer; the next request,
// another client's, must get its own answer.
func TestUnrequestedBytesNeverReachAnotherClient(t *testing.T) {
	w := fasttest.StartRogueUpstream(t)
	f := startAt(t, "", w.Addr)
	fasttest.CheckNoCrossedAnswers(t, f.addr, func(path string) string {
		return "GET " + path + " HTTP/1.1\r\nHost: app.test\r\n\r\n"
	}, w, f.gov.Metrics, "ingress")
}
