package egress

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/warden-dev/warden/internal/testkit/fasttest"
)

// holdUpstream answers "ok", holding requests for /hold until open is
// called (at the latest when the test ends).
func holdUpstream(t *testing.T) (up *fasttest.Upstream, open func()) {
	gate := make(chan struct{})
	var once sync.Once
	open = func() { once.Do(func() { close(gate) }) }
	up = fasttest.StartUpstream(t, func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) == "/hold" {
			<-gate
		}
		ctx.WriteString("ok")
	})
	t.Cleanup(open) // before the upstream's shutdown, which waits for its handlers
	return up, open
}

// TestReloadKeepsPoolState: a reload that keeps a pool's name and settings
// keeps its in-flight count, so a request holding the only slot still
// holds it afterwards.
func TestReloadKeepsPoolState(t *testing.T) {
	up, open := holdUpstream(t)
	other := fasttest.StartUpstream(t, func(ctx *fasthttp.RequestCtx) {})
	api := target("api", []string{"api.test"}, "http://"+up.Addr, "pools: [one]")
	pools := "pools:\n  one: { concurrency: 1 }\n"
	yaml := egressPolicy("  allow_unlisted: false", "targets:\n"+api+pools)
	f := start(t, yaml, nil)
	held := f.goDo("GET", "http://api.test/hold", nil)
	fasttest.WaitFor(t, "the slot taken", func() bool { return up.InFlight.Load() == 1 })
	f.reload(t, egressPolicy("  allow_unlisted: false", "targets:\n"+api+target("other", []string{"other.test"}, "http://"+other.Addr, "")+pools))
	if r := f.do(t, "GET", "http://api.test/", nil); r.status != 429 || r.header.Get("X-Warden-Control") != "pool_queue" {
		t.Fatalf("the reload forgot the request in flight: %+v", r)
	}
	open()
	if r := <-held; r.status != 200 {
		t.Fatalf("held request: %+v", r)
	}
	if r := f.do(t, "GET", "http://api.test/", nil); r.status != 200 {
		t.Fatalf("after the slot was released: %+v", r)
	}
}

// TestReloadReplacesUpstreamPool: changing a target's connection settings
// gives it a new connection pool; the request in flight on the old one
// finishes there.
func TestReloadReplacesUpstreamPool(t *testing.T) {
	up, open := holdUpstream(t)
	yaml := egressPolicy("  allow_unlisted: false", "targets:\n"+target("api", []string{"api.test"}, "http://"+up.Addr, "max_connections: 4"))
	f := start(t, yaml, nil)
	old := f.eg.table.Load().byHost["api.test"].fixed
	held := f.goDo("GET", "http://api.test/hold", nil)
	fasttest.WaitFor(t, "request in flight", func() bool { return up.InFlight.Load() == 1 })
	f.reload(t, strings.Replace(yaml, "max_connections: 4", "max_connections: 8", 1))
	if f.eg.table.Load().byHost["api.test"].fixed == old {
		t.Fatal("changed max_connections kept the old pool")
	}
	if r := f.do(t, "GET", "http://api.test/", nil); r.status != 200 || r.body != "ok" {
		t.Fatalf("on the new pool: %+v", r)
	}
	open()
	if r := <-held; r.status != 200 || r.body != "ok" {
		t.Fatalf("request in flight on the old pool: %+v", r)
	}
	fasttest.WaitFor(t, "the old pool to close its connection", func() bool { return old.Stats().Open == 0 })
}

// TestReloadAppliesToDynamicPools: connection settings changed by a reload
// apply to hosts reached without a fixed upstream too (unlisted hosts,
// targets without upstream), whose pools are made on demand per host.
func TestReloadAppliesToDynamicPools(t *testing.T) {
	up, open := holdUpstream(t)
	yaml := egressPolicy("  allow_unlisted: true\n  defaults: { max_connections: 1, timeout: 0s }", "")
	f := start(t, yaml, nil)
	held := f.goDo("GET", "http://"+up.Addr+"/hold", nil)
	fasttest.WaitFor(t, "the only connection taken", func() bool { return up.InFlight.Load() == 1 })
	f.reload(t, strings.Replace(yaml, "max_connections: 1", "max_connections: 2", 1))
	second := f.goDo("GET", "http://"+up.Addr+"/hold", nil)
	fasttest.WaitFor(t, "a second connection under the new max_connections", func() bool { return up.InFlight.Load() == 2 })
	open()
	for _, ch := range []<-chan reply{held, second} {
		if r := <-ch; r.status != 200 {
			t.Fatalf("held request: %+v", r)
		}
	}
}

// TestFailedRebindKeepsPools: a reload that moves the listener to an
// address already taken fails as a whole — in particular the target's
// connection pool, whose settings the reload also changed, is not replaced
// under the table still in use.
func TestFailedRebindKeepsPools(t *testing.T) {
	up := fasttest.StartUpstream(t, func(ctx *fasthttp.RequestCtx) { ctx.WriteString("ok") })
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	yaml := egressPolicy("  allow_unlisted: false", "targets:\n"+target("api", []string{"api.test"}, "http://"+up.Addr, "max_connections: 4"))
	f := start(t, yaml, nil)
	old := f.eg.table.Load().byHost["api.test"].fixed
	moved := strings.Replace(strings.Replace(yaml, "max_connections: 4", "max_connections: 8", 1),
		"http_listen: 127.0.0.1:0", "http_listen: "+taken.Addr().String(), 1)
	if err := f.eg.Apply(context.Background(), f.gov.Load(t, moved)); err == nil {
		t.Fatal("a reload onto a taken address succeeded")
	}
	if f.eg.table.Load().byHost["api.test"].fixed != old {
		t.Fatal("the failed reload swapped the table")
	}
	if r := f.do(t, "GET", "http://api.test/", nil); r.status != 200 || r.body != "ok" {
		t.Fatalf("after the failed reload: %+v", r)
	}
	if old.Stats().Open == 0 {
		t.Fatal("the request did not go through the table's pool")
	}
}
