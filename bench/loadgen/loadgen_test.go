package loadgen

import (
	"context"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/goleak"

	"github.com/warden-dev/warden/internal/testkit/fasttest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, fasttest.LeakOptions()...) }

func TestClosedAndOpenLoop(t *testing.T) {
	up := fasttest.StartUpstream(t, func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Request.Header.Peek("X-Tenant-Id")) != "bench" || string(ctx.Host()) != "api.bench" {
			ctx.SetStatusCode(400)
		}
	})
	base := Config{Addr: up.Addr, Host: "api.bench", Header: map[string]string{"X-Tenant-Id": "bench"},
		Concurrency: 4, Warmup: 100 * time.Millisecond, Duration: 500 * time.Millisecond}
	closed, err := Run(context.Background(), base)
	if err != nil || closed.Errors != 0 || closed.Requests == 0 || closed.Latency.Count() != closed.Requests {
		t.Fatalf("closed loop: %+v %v", closed, err)
	}
	open := base
	open.Rate = 400
	res, err := Run(context.Background(), open)
	if err != nil || res.Errors != 0 {
		t.Fatalf("open loop: %+v %v", res, err)
	}
	// 400/s for 0.5 s: the schedule, not the server, sets the count (a
	// loaded machine may fall behind it, never ahead).
	if res.Requests < 100 || res.Requests > 210 {
		t.Fatalf("open loop at 400/s sent %d in 0.5 s", res.Requests)
	}
	bad := base
	bad.Header = nil
	res, err = Run(context.Background(), bad)
	if err != nil || res.Requests != 0 || res.Errors == 0 || res.FirstError == "" {
		t.Fatalf("errors not counted: %+v", res)
	}
}
