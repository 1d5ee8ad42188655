package ingress

import (
	"context"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/internal/testkit/fasttest"
)

// BenchmarkIngressHandler measures the ingress request path — framing
// scan, tenant cap, request ID, hop-by-hop stripping, the exchange with the
// worker over a pooled loopback connection and the response handling —
// by calling the handler with a reused RequestCtx, as fasthttp's server
// does. allocs/op is warden's steady-state allocation per proxied request
// (the in-process fasthttp upstream allocates nothing per request).
func BenchmarkIngressHandler(b *testing.B) {
	worker := fasttest.StartUpstream(b, func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString(`{"ok":true}`) })
	gov, ctl := fasttest.NewGovernor(b, clock.Real{}, policyFor(worker.Addr, "  tenant: { header: x-tenant-id, rate: 1000000000, window: 60 }"))
	in := New(Options{Metrics: gov.Metrics})
	if err := in.Apply(context.Background(), ctl); err != nil {
		b.Fatal(err)
	}
	defer in.Shutdown(context.Background())
	worker.NoPaths.Store(true)
	reqs := fasttest.NewRequests("GET /v1/items?id=42 HTTP/1.1\r\nHost: svc\r\nUser-Agent: bench\r\nAccept: application/json\r\nX-Tenant-Id: acme\r\n\r\n")
	b.ReportAllocs()
	for b.Loop() {
		ctx, err := reqs.Next()
		if err != nil {
			b.Fatal(err)
		}
		in.handle(ctx)
		if ctx.Response.StatusCode() != 200 {
			b.Fatalf("status %d: %s", ctx.Response.StatusCode(), ctx.Response.Body())
		}
	}
}
