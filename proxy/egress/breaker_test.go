package egress

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warden-dev/warden/internal/testkit/fasttest"
	"github.com/warden-dev/warden/internal/testkit/loopback"
)

const flakyBreaker = "circuit_breaker: { enabled: true, failure_ratio: 0.5, minimum_requests: 4, window: 30s, open: 5s, max_open: 60s }"

// statusUpstream answers with whatever status is set, and can hold
// requests at a gate.
type statusUpstream struct {
	*fasttest.Upstream
	status atomic.Int64
	gate   atomic.Pointer[chan struct{}]
}

func startStatusUpstream(t *testing.T) *statusUpstream {
	s := &statusUpstream{}
	s.status.Store(200)
	s.Upstream = fasttest.StartUpstream(t, func(ctx *fasthttp.RequestCtx) {
		if g := s.gate.Load(); g != nil {
			<-*g
		}
		ctx.SetStatusCode(int(s.status.Load()))
		ctx.WriteString("upstream says " + strings.Repeat("x", 3))
	})
	return s
}

func breakerFixture(t *testing.T, cb string) (*fixture, *statusUpstream, string) {
	up := startStatusUpstream(t)
	yaml := egressPolicy("  allow_unlisted: false", "targets:\n"+target("flaky", []string{"flaky.test"}, "http://"+up.Addr, cb))
	return start(t, yaml, nil), up, yaml
}

// trip sends n failing requests that must all reach the upstream.
func trip(t *testing.T, f *fixture, up *statusUpstream, n int) {
	t.Helper()
	up.status.Store(503)
	for i := range n {
		before := up.Requests.Load()
		if r := f.do(t, "GET", "http://flaky.test/", nil); r.status != 503 || r.header.Get("X-Warden-Control") != "" {
			t.Fatalf("failure %d: %+v", i+1, r)
		}
		if up.Requests.Load() != before+1 {
			t.Fatalf("failure %d did not reach the upstream", i+1)
		}
	}
}

func expectOpen(t *testing.T, f *fixture, up *statusUpstream, retryAfter string) {
	t.Helper()
	before := up.Requests.Load()
	r := f.do(t, "GET", "http://flaky.test/", nil)
	if r.status != 503 || r.header.Get("X-Warden-Control") != "circuit_breaker" || r.header.Get("Retry-After") != retryAfter ||
		r.body != `{"control":"circuit_breaker","target":"flaky","retryAfterSeconds":`+retryAfter+`}` {
		t.Fatalf("want a fast failure with Retry-After %s, got %+v", retryAfter, r)
	}
	if up.Requests.Load() != before {
		t.Fatal("an open breaker let a request reach the upstream")
	}
}

func TestBreakerOpensAndFailsFast(t *testing.T) {
	f, up, _ := breakerFixture(t, flakyBreaker)
	trip(t, f, up, 3) // below minimum_requests: never opens
	if r := f.do(t, "GET", "http://flaky.test/", nil); r.status != 503 || r.header.Get("X-Warden-Control") != "" {
		t.Fatalf("4th failure should still reach the upstream: %+v", r)
	}
	expectOpen(t, f, up, "5")
	f.clk.Advance(2 * time.Second)
	expectOpen(t, f, up, "3")
	if n := fasttest.Value(f.gov.Metrics.Rejections.WithLabelValues("circuit_breaker", "flaky")); n != 2 {
		t.Fatalf("rejections{circuit_breaker,flaky} = %v", n)
	}
	if _, err := f.gov.Metrics.Gather(); err != nil { // as a scrape does
		t.Fatal(err)
	}
	if n := fasttest.Value(f.gov.Metrics.BreakerState.WithLabelValues("flaky")); n != 2 {
		t.Fatalf("warden_breaker_state{flaky} = %v, want 2 (open)", n)
	}
}

// TestBreakerSingleProbe: after open, 50 concurrent callers get exactly one
// probe to the upstream; a successful probe closes the breaker.
func TestBreakerSingleProbe(t *testing.T) {
	f, up, _ := breakerFixture(t, flakyBreaker)
	trip(t, f, up, 4)
	expectOpen(t, f, up, "5")
	f.clk.Advance(5 * time.Second)
	gate := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(gate) }) }
	defer open()
	up.gate.Store(&gate)
	up.status.Store(200)
	before := up.Requests.Load()
	var wg sync.WaitGroup
	var fast, ok, other atomic.Int64
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, _ := f.try("GET", "http://flaky.test/", nil)
			switch {
			case r.status == 503 && r.header.Get("X-Warden-Control") == "circuit_breaker":
				fast.Add(1)
			case r.status == 200:
				ok.Add(1)
			default:
				other.Add(1)
			}
		}()
	}
	fasttest.WaitFor(t, "49 fast failures", func() bool { return fast.Load() == 49 })
	if n := up.Requests.Load() - before; n != 1 {
		t.Fatalf("%d probes reached the upstream, want exactly 1", n)
	}
	open()
	wg.Wait()
	up.gate.Store(nil)
	if ok.Load() != 1 || other.Load() != 0 {
		t.Fatalf("probe results: ok %d other %d", ok.Load(), other.Load())
	}
	// Closed again: requests flow.
	for range 5 {
		if r := f.do(t, "GET", "http://flaky.test/", nil); r.status != 200 {
			t.Fatalf("after a successful probe: %+v", r)
		}
	}
}

func TestBreakerFailedProbeDoublesOpen(t *testing.T) {
	f, up, _ := breakerFixture(t, flakyBreaker)
	trip(t, f, up, 4)
	f.clk.Advance(5 * time.Second)
	// The probe fails: open again, for 10 s now.
	if r := f.do(t, "GET", "http://flaky.test/", nil); r.status != 503 || r.header.Get("X-Warden-Control") != "" {
		t.Fatalf("probe should reach the upstream: %+v", r)
	}
	expectOpen(t, f, up, "10")
	f.clk.Advance(5 * time.Second)
	expectOpen(t, f, up, "5")
	f.clk.Advance(5 * time.Second)
	up.status.Store(200)
	if r := f.do(t, "GET", "http://flaky.test/", nil); r.status != 200 {
		t.Fatalf("probe after the doubled open: %+v", r)
	}
}

// TestBreakerClassification: only server-side trouble counts.
func TestBreakerClassification(t *testing.T) {
	tests := []struct {
		name   string
		status int
		opens  bool
	}{
		{"404 storm", 404, false},
		{"422", 422, false},
		{"500", 500, true},
		{"503", 503, true},
		{"429", 429, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, up, _ := breakerFixture(t, flakyBreaker)
			up.status.Store(int64(tc.status))
			for range 20 {
				f.do(t, "GET", "http://flaky.test/", nil)
			}
			opened := up.Requests.Load() < 20
			if opened != tc.opens {
				t.Fatalf("%d × %d: upstream saw %d requests; opened=%v, want %v", 20, tc.status, up.Requests.Load(), opened, tc.opens)
			}
		})
	}
	t.Run("timeouts", func(t *testing.T) {
		up := startStatusUpstream(t)
		gate := make(chan struct{})
		defer close(gate)
		up.gate.Store(&gate)
		f := start(t, egressPolicy("  allow_unlisted: false", "targets:\n"+
			target("flaky", []string{"flaky.test"}, "http://"+up.Addr, flakyBreaker+"\ntimeout: 50ms")), nil)
		for range 4 {
			if r := f.do(t, "GET", "http://flaky.test/", nil); r.status != 504 {
				t.Fatalf("timeout: %+v", r)
			}
		}
		expectOpen(t, f, up, "5")
	})
	t.Run("connection errors", func(t *testing.T) {
		f := start(t, egressPolicy("  allow_unlisted: false", "targets:\n"+
			target("flaky", []string{"flaky.test"}, "http://"+loopback.FreeAddr(t), flakyBreaker)), nil)
		for range 4 {
			if r := f.do(t, "GET", "http://flaky.test/", nil); r.status != 502 {
				t.Fatalf("connection refused: %+v", r)
			}
		}
		if r := f.do(t, "GET", "http://flaky.test/", nil); r.status != 503 || r.header.Get("X-Warden-Control") != "circuit_breaker" {
			t.Fatalf("breaker did not open on connection errors: %+v", r)
		}
	})
}

// TestReloadKeepsBreakerState: a reload that keeps the target's name and
// breaker settings keeps the open breaker; changed settings start afresh.
func TestReloadKeepsBreakerState(t *testing.T) {
	f, up, yaml := breakerFixture(t, flakyBreaker)
	trip(t, f, up, 4)
	expectOpen(t, f, up, "5")
	other := fasttest.StartUpstream(t, func(ctx *fasthttp.RequestCtx) {})
	f.reload(t, yaml+target("other", []string{"other.test"}, "http://"+other.Addr, ""))
	expectOpen(t, f, up, "5")
	f.reload(t, strings.Replace(yaml, "open: 5s", "open: 6s", 1))
	up.status.Store(200)
	if r := f.do(t, "GET", "http://flaky.test/", nil); r.status != 200 {
		t.Fatalf("changed breaker settings kept the old state: %+v", r)
	}
}

// TestTargetsSharingAHostShareABreaker: failures through one target open
// the breaker of every target sending to the same host (SPEC §4), and the
// fast failure names the target that was asked for.
func TestTargetsSharingAHostShareABreaker(t *testing.T) {
	up := startStatusUpstream(t)
	f := start(t, egressPolicy("  allow_unlisted: false", "targets:\n"+
		target("flaky", []string{"flaky.test"}, "http://"+up.Addr, flakyBreaker)+
		target("alias", []string{"alias.test"}, "http://"+up.Addr, flakyBreaker)), nil)
	trip(t, f, up, 4)
	before := up.Requests.Load()
	r := f.do(t, "GET", "http://alias.test/", nil)
	if r.status != 503 || r.header.Get("X-Warden-Control") != "circuit_breaker" ||
		r.body != `{"control":"circuit_breaker","target":"alias","retryAfterSeconds":5}` {
		t.Fatalf("alias shares flaky's host and should fail fast: %+v", r)
	}
	if up.Requests.Load() != before {
		t.Fatal("the shared open breaker let alias's request reach the upstream")
	}
}

// TestClientGoneIsNeutral: a failure the client did not wait for (it
// closed its connection while the upstream was being asked) is neither a
// failure nor a success for the breaker.
func TestClientGoneIsNeutral(t *testing.T) {
	f, up, _ := breakerFixture(t, flakyBreaker)
	up.status.Store(503)
	served := f.gov.Metrics.Requests.WithLabelValues("egress", "flaky", "503")
	for i := range 4 {
		gate := make(chan struct{})
		up.gate.Store(&gate)
		before := up.Requests.Load()
		c, err := net.Dial("tcp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(c, "GET http://flaky.test/ HTTP/1.1\r\nHost: flaky.test\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		fasttest.WaitFor(t, "the request at the upstream", func() bool { return up.Requests.Load() == before+1 })
		c.Close()
		close(gate)
		fasttest.WaitFor(t, "the exchange to end", func() bool { return fasttest.Value(served) == float64(i+1) })
	}
	up.gate.Store(nil)
	// Had the four counted, minimum_requests 4 at ratio 0.5 would have
	// opened the breaker; this failure must still reach the upstream.
	before := up.Requests.Load()
	if r := f.do(t, "GET", "http://flaky.test/", nil); r.status != 503 || r.header.Get("X-Warden-Control") != "" || up.Requests.Load() != before+1 {
		t.Fatalf("the breaker counted failures no client waited for: %+v", r)
	}
}

// TestStreamedBodyCutByTimeoutIsAFailure: a 200 whose streamed body the
// target's timeout cuts is a breaker failure and a timeout rejection, not
// a success recorded when its head arrived.
func TestStreamedBodyCutByTimeoutIsAFailure(t *testing.T) {
	stop := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for range 20 {
			w.Write([]byte(strings.Repeat("x", 100)))
			w.(http.Flusher).Flush()
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}))
	defer up.Close()
	defer close(stop) // before Close, which waits for the handler
	f := start(t, egressPolicy("  allow_unlisted: false", "targets:\n"+target("trickle", []string{"trickle.test"}, up.URL,
		"timeout: 200ms\ncircuit_breaker: { enabled: true, minimum_requests: 1 }")), nil)
	r, err := f.try("GET", "http://trickle.test/", nil)
	if err == nil || r.status != 200 {
		t.Fatalf("want a 200 whose body is cut, got %+v, %v", r, err)
	}
	b := f.gov.Current().Targets["trickle"].Breaker
	deadline := time.Now().Add(5 * time.Second)
	for b.Snapshot().Failures != 1 { // the body's end is recorded as the client sees it cut
		if time.Now().After(deadline) {
			t.Fatalf("breaker after a cut body: %+v", b.Snapshot())
		}
		time.Sleep(time.Millisecond)
	}
	if n := fasttest.Value(f.gov.Metrics.Rejections.WithLabelValues("timeout", "trickle")); n != 1 {
		t.Fatalf("rejections{timeout,trickle} = %v", n)
	}
}
