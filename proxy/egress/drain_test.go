package egress

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warden-dev/warden/internal/testkit/fasttest"
	"github.com/warden-dev/warden/proxy/clientwait"
)

// connWaiting is how many requests wait for one of api's upstream
// connections (max_connections).
func connWaiting(f *fixture) int {
	return f.eg.table.Load().byHost["api.test"].fixed.Stats().Waiting
}

// waitingFixture starts an egress whose target api lets one request reach
// its upstream at a time, held there until open is called: through its
// max_connections, or through a pool's concurrency. waiting counts the
// requests queued behind it.
func waitingFixture(t *testing.T, byPool bool) (f *fixture, up *fasttest.Upstream, open func(), waiting func() int) {
	if byPool {
		f, up, open = poolFixture(t, "{ concurrency: 1, queue: 5, max_wait: 30s }")
		return f, up, open, func() int { return int(queued(f)) }
	}
	gate := make(chan struct{})
	closed := false
	open = func() {
		if !closed {
			closed = true
			close(gate)
		}
	}
	up = fasttest.StartUpstream(t, func(ctx *fasthttp.RequestCtx) { <-gate })
	t.Cleanup(open)
	f = start(t, egressPolicy("  allow_unlisted: false", "targets:\n"+target("api", []string{"api.test"}, "http://"+up.Addr, "max_connections: 1")), nil)
	return f, up, open, func() int { return connWaiting(f) }
}

var waits = []struct {
	name   string
	byPool bool
}{
	{"waiting for an upstream connection", false},
	{"waiting in a pool's queue", true},
}

// SIGTERM's drain lets in-flight requests finish within the grace, and a
// request waiting its turn is in flight: it is served when its turn comes,
// not cancelled when the drain begins.
func TestDrainLetsWaitingRequestsFinish(t *testing.T) {
	for _, tc := range waits {
		t.Run(tc.name, func(t *testing.T) {
			f, up, open, waiting := waitingFixture(t, tc.byPool)
			first := f.goDo("GET", "http://api.test/first", nil)
			fasttest.WaitFor(t, "one in flight", func() bool { return up.InFlight.Load() == 1 })
			second := f.goDo("GET", "http://api.test/second", nil)
			fasttest.WaitFor(t, "one waiting", func() bool { return waiting() == 1 })

			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			drained := make(chan error, 1)
			go func() { drained <- f.eg.Shutdown(ctx) }()
			fasttest.WaitFor(t, "the listener to stop accepting", func() bool {
				c, err := net.DialTimeout("tcp", f.addr, time.Second)
				if err == nil {
					c.Close()
				}
				return err != nil
			})
			select {
			case r := <-second:
				t.Fatalf("the waiting request ended when the drain began: %+v", r)
			default:
			}
			open()
			for name, ch := range map[string]<-chan reply{"first": first, "second": second} {
				if r := <-ch; r.status != 200 {
					t.Errorf("%s request: %+v, want 200", name, r)
				}
			}
			if n := up.Requests.Load(); n != 2 {
				t.Errorf("upstream saw %d requests, want 2", n)
			}
			if err := <-drained; err != nil {
				t.Errorf("drain: %v", err)
			}
		})
	}
}

// A client that hangs up while its request waits (for an upstream
// connection, or in a pool's queue) gives its place back, and its request
// is never sent: it could be a POST nobody is there to see the answer of,
// and in a pool it would spend a concurrency and a rate slot on nobody.
// It is recorded as 499 and counted as no control's refusal.
func TestClientGoneLeavesItsWait(t *testing.T) {
	for _, tc := range waits {
		t.Run(tc.name, func(t *testing.T) {
			f, up, open, waiting := waitingFixture(t, tc.byPool)
			first := f.goDo("GET", "http://api.test/", nil)
			defer open()
			fasttest.WaitFor(t, "one in flight", func() bool { return up.InFlight.Load() == 1 })
			c, err := net.Dial("tcp", f.addr)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.Write([]byte("POST http://api.test/gone HTTP/1.1\r\nHost: api.test\r\nContent-Length: 2\r\n\r\nhi")); err != nil {
				t.Fatal(err)
			}
			fasttest.WaitFor(t, "one waiting", func() bool { return waiting() == 1 })
			c.Close()
			// A few checks' worth of fake time, far less than max_wait
			// or any timeout: the request must leave because its client
			// did, not because it timed out.
			checks := 0
			fasttest.WaitFor(t, "the wait to end", func() bool {
				if waiting() == 0 {
					return true
				}
				if checks < 20 {
					f.clk.Advance(clientwait.CheckInterval)
					checks++
				}
				return false
			})
			open()
			if r := <-first; r.status != 200 {
				t.Fatalf("first request got %+v", r)
			}
			if n := up.Requests.Load(); n != 1 {
				t.Fatalf("upstream saw %d requests, want 1: the abandoned one was sent", n)
			}
			if n := fasttest.Value(f.gov.Metrics.Requests.WithLabelValues("egress", "api", "499")); n != 1 {
				t.Errorf("warden_requests_total{code=499} = %v, want 1", n)
			}
			for _, control := range []string{"pool_queue", "pool_concurrency"} {
				if n := fasttest.Value(f.gov.Metrics.Rejections.WithLabelValues(control, "p")); n != 0 {
					t.Fatalf("a client that left counted as a %s rejection (%v)", control, n)
				}
			}
		})
	}
}
