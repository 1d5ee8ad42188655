package egress

import (
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warden-dev/warden/internal/testkit/fasttest"
	"github.com/warden-dev/warden/proxy/clientwait"
)

// poolFixture's upstream holds every request until open is called (at the
// latest when the test ends, so a failing test cannot hang its cleanup).
func poolFixture(t *testing.T, pool string) (f *fixture, up *fasttest.Upstream, open func()) {
	gate := make(chan struct{})
	var once sync.Once
	open = func() { once.Do(func() { close(gate) }) }
	up = fasttest.StartUpstream(t, func(ctx *fasthttp.RequestCtx) { <-gate })
	t.Cleanup(open)
	yaml := egressPolicy("  allow_unlisted: false", "targets:\n"+target("api", []string{"api.test"}, "http://"+up.Addr, "pools: [p]")+
		"pools:\n  p: "+pool+"\n")
	return start(t, yaml, nil), up, open
}

func queued(f *fixture) float64 { return fasttest.Value(f.gov.Metrics.PoolQueued.WithLabelValues("p")) }

// TestPoolConcurrency: with concurrency 2 the upstream never has more than
// two requests in flight; the rest wait in the pool's queue and all finish.
func TestPoolConcurrency(t *testing.T) {
	f, up, open := poolFixture(t, "{ concurrency: 2, queue: 100, max_wait: 30s }")
	var results []<-chan reply
	for range 10 {
		results = append(results, f.goDo("GET", "http://api.test/", nil))
	}
	fasttest.WaitFor(t, "2 in flight and 8 queued", func() bool { return up.InFlight.Load() == 2 && queued(f) == 8 })
	open()
	for _, ch := range results {
		if r := <-ch; r.status != 200 {
			t.Fatalf("queued request got %+v", r)
		}
	}
	if p := up.Peak.Load(); p != 2 {
		t.Fatalf("peak in flight at the upstream %d, want 2", p)
	}
}

func TestPoolRefusals(t *testing.T) {
	t.Run("queue full", func(t *testing.T) {
		f, up, open := poolFixture(t, "{ concurrency: 1, queue: 1, max_wait: 30s }")
		a, b := f.goDo("GET", "http://api.test/", nil), f.goDo("GET", "http://api.test/", nil)
		fasttest.WaitFor(t, "one in flight, one queued", func() bool { return up.InFlight.Load() == 1 && queued(f) == 1 })
		r := f.do(t, "GET", "http://api.test/", nil)
		open()
		<-a
		<-b
		if r.status != 429 || r.header.Get("X-Warden-Control") != "pool_queue" || r.header.Get("Retry-After") != "1" ||
			r.body != `{"control":"pool_queue","pool":"p","target":"api","retryAfterSeconds":1}` {
			t.Fatalf("%+v", r)
		}
		if n := fasttest.Value(f.gov.Metrics.Rejections.WithLabelValues("pool_queue", "p")); n != 1 {
			t.Fatalf("rejections{pool_queue,p} = %v", n)
		}
	})
	// A request that waits for 100 Continue hears the queue-full refusal
	// before it sends its body; with room in the queue it is told to go on
	// and waits there once the body has come.
	t.Run("queue full, before the body", func(t *testing.T) {
		f, up, open := poolFixture(t, "{ concurrency: 1, queue: 1, max_wait: 30s }")
		a := f.goDo("GET", "http://api.test/", nil)
		fasttest.WaitFor(t, "one in flight", func() bool { return up.InFlight.Load() == 1 })
		head := "POST http://api.test/ HTTP/1.1\r\nHost: api.test\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"
		resp, br, c := fasttest.FirstAnswer(t, f.addr, head)
		if resp.StatusCode != 100 {
			t.Fatalf("with room in the queue: %d, want 100 Continue", resp.StatusCode)
		}
		io.WriteString(c, "hello")
		fasttest.WaitFor(t, "the POST queued", func() bool { return queued(f) == 1 })
		resp, _, _ = fasttest.FirstAnswer(t, f.addr, head)
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 429 || resp.Header.Get("X-Warden-Control") != "pool_queue" ||
			string(body) != `{"control":"pool_queue","pool":"p","target":"api","retryAfterSeconds":1}` {
			t.Fatalf("queue full: %d %v %s, want pool_queue's 429 before the body", resp.StatusCode, resp.Header, body)
		}
		open()
		<-a
		if r, err := http.ReadResponse(br, nil); err != nil || r.StatusCode != 200 {
			t.Fatalf("the queued POST: %v %v, want 200", r, err)
		}
		if n := fasttest.Value(f.gov.Metrics.Rejections.WithLabelValues("pool_queue", "p")); n != 1 {
			t.Fatalf("rejections{pool_queue,p} = %v", n)
		}
	})
	t.Run("max_wait", func(t *testing.T) {
		f, up, open := poolFixture(t, "{ concurrency: 1, queue: 5, max_wait: 2s }")
		first := f.goDo("GET", "http://api.test/", nil)
		defer func() { open(); <-first }()
		fasttest.WaitFor(t, "one in flight", func() bool { return up.InFlight.Load() == 1 })
		done := f.goDo("GET", "http://api.test/", nil)
		fasttest.WaitFor(t, "one queued", func() bool { return queued(f) == 1 })
		f.clk.Advance(2 * time.Second)
		r := <-done
		if r.status != 429 || r.header.Get("X-Warden-Control") != "pool_concurrency" {
			t.Fatalf("%+v", r)
		}
	})
	t.Run("rate", func(t *testing.T) {
		f, _, open := poolFixture(t, "{ rate: 2, window: 60 }")
		open()
		for range 2 {
			if r := f.do(t, "GET", "http://api.test/", nil); r.status != 200 {
				t.Fatal(r)
			}
		}
		r := f.do(t, "GET", "http://api.test/", nil)
		if r.status != 429 || r.header.Get("X-Warden-Control") != "pool_queue" || r.header.Get("Retry-After") != "40" {
			t.Fatalf("%+v", r)
		}
	})
}

func TestEgressTenantCap(t *testing.T) {
	up := fasttest.StartUpstream(t, func(ctx *fasthttp.RequestCtx) {})
	f := start(t, egressPolicy("  allow_unlisted: true\n  tenant: { header: x-tenant-id, rate: 2, window: 60 }", ""), nil)
	for range 2 {
		if r := f.do(t, "GET", "http://"+up.Addr+"/", map[string]string{"X-Tenant-Id": "acme"}); r.status != 200 {
			t.Fatal(r)
		}
	}
	r := f.do(t, "GET", "http://"+up.Addr+"/", map[string]string{"X-Tenant-Id": "acme"})
	if r.status != 429 || r.header.Get("X-Warden-Control") != "tenant_rate" || r.header.Get("Retry-After") != "40" ||
		r.body != `{"control":"tenant_rate","quota":"tenant:acme","limit":2,"current":3,"retryAfterSeconds":40}` {
		t.Fatalf("%+v", r)
	}
	if up.Requests.Load() != 2 || !strings.Contains(r.header.Get("Ratelimit-Limit"), "2") {
		t.Fatalf("upstream saw %d", up.Requests.Load())
	}
	if n := fasttest.Value(f.gov.Metrics.Rejections.WithLabelValues("tenant_rate", "egress")); n != 1 {
		t.Fatalf("rejections{tenant_rate,egress} = %v", n)
	}
}

// Tenants beyond max_keys are counted in the overflow window on the egress
// too.
func TestEgressTenantOverflow(t *testing.T) {
	up := fasttest.StartUpstream(t, func(ctx *fasthttp.RequestCtx) {})
	f := start(t, egressPolicy("  allow_unlisted: true\n  tenant: { header: x-tenant-id, rate: 1, window: 60, max_keys: 1 }", ""), nil)
	for _, tenant := range []string{"a", "b"} {
		if r := f.do(t, "GET", "http://"+up.Addr+"/", map[string]string{"X-Tenant-Id": tenant}); r.status != 200 {
			t.Fatalf("tenant %s: %+v", tenant, r)
		}
	}
	r := f.do(t, "GET", "http://"+up.Addr+"/", map[string]string{"X-Tenant-Id": "c"})
	if r.status != 429 || r.header.Get("X-Warden-Control") != "tenant_rate" || r.header.Get("Retry-After") != "40" ||
		r.header.Get("Ratelimit-Limit") != "1" ||
		r.body != `{"control":"tenant_rate","quota":"tenant_overflow","limit":1,"current":2,"retryAfterSeconds":40}` {
		t.Fatalf("%+v", r)
	}
	if n := fasttest.Value(f.gov.Metrics.TenantOverflow.WithLabelValues("egress")); n != 2 {
		t.Fatalf("warden_tenant_overflow_total{egress} = %v, want 2", n)
	}
}

// TestTimeoutBoundsPoolWait: a request waiting in a pool's queue gets its
// target's 504 when the timeout passes, without reaching the upstream; the
// wait is warden's own, so the target's breaker hears nothing of it.
func TestTimeoutBoundsPoolWait(t *testing.T) {
	up, open := holdUpstream(t)
	f := start(t, egressPolicy("  allow_unlisted: false", "targets:\n"+
		target("slow", []string{"slow.test"}, "http://"+up.Addr, "timeout: 0s\npools: [p]")+
		target("api", []string{"api.test"}, "http://"+up.Addr,
			"timeout: 200ms\npools: [p]\ncircuit_breaker: { enabled: true, failure_ratio: 0.5, minimum_requests: 1 }")+
		"pools:\n  p: { concurrency: 1, queue: 5, max_wait: 30s }\n"), nil)
	held := f.goDo("GET", "http://slow.test/hold", nil)
	defer func() { open(); <-held }()
	fasttest.WaitFor(t, "the pool's only slot taken", func() bool { return up.InFlight.Load() == 1 })
	waiting := f.goDo("GET", "http://api.test/", nil)
	var r reply
	select {
	case r = <-waiting:
	case <-time.After(10 * time.Second): // a failure bound, not a wait for the timeout
		t.Error("still waiting in the pool 10 s after its 200ms timeout")
		open()
		r = <-waiting
	}
	if r.status != 504 || r.header.Get("X-Warden-Control") != "timeout" || !strings.Contains(r.body, `"control":"timeout","target":"api"`) {
		t.Fatalf("queued past its timeout: %+v", r)
	}
	if n := up.Requests.Load(); n != 1 {
		t.Fatalf("upstream saw %d requests; the timed-out one must not reach it", n)
	}
	open()
	if r := f.do(t, "GET", "http://api.test/", nil); r.status != 200 {
		t.Fatalf("the breaker counted the wait in warden's own queue: %+v", r)
	}
}

// TestClientLeavingGivesTheSlotBack: a client that hangs up while its
// request waits for the upstream's answer gets the exchange given up at
// the next client check: the pool's slot and the upstream connection are
// freed for the next request instead of being held until the answer, and
// the breaker hears nothing.
func TestClientLeavingGivesTheSlotBack(t *testing.T) {
	f, up, open := poolFixture(t, "{ concurrency: 1, queue: 5, max_wait: 30s }")
	defer open()
	c, err := net.Dial("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(c, "GET http://api.test/ HTTP/1.1\r\nHost: api.test\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	fasttest.WaitFor(t, "the request at the upstream", func() bool { return up.InFlight.Load() == 1 })
	next := f.goDo("GET", "http://api.test/next", nil)
	fasttest.WaitFor(t, "the next request queued", func() bool { return queued(f) == 1 })

	f.clk.Advance(clientwait.CheckInterval) // the client is still there
	if up.Requests.Load() != 1 || queued(f) != 1 {
		t.Fatal("an exchange whose client is still there was given up")
	}
	c.Close()
	gone := f.gov.Metrics.Requests.WithLabelValues("egress", "api", "499")
	fasttest.WaitFor(t, "the exchange given up", func() bool {
		f.clk.Advance(clientwait.CheckInterval)
		return fasttest.Value(gone) == 1
	})
	fasttest.WaitFor(t, "the next request at the upstream", func() bool { return up.Requests.Load() == 2 })
	open()
	if r := <-next; r.status != 200 {
		t.Fatalf("next request: %+v", r)
	}
	if n := fasttest.Value(f.gov.Metrics.Rejections.WithLabelValues("upstream", "api")); n != 0 {
		t.Errorf("rejections{upstream,api} = %v: the client's leaving was blamed on the upstream", n)
	}
}
