package egress

import (
	"bufio"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warden-dev/warden/governor/control"
	"github.com/warden-dev/warden/internal/testkit/fasttest"
)

func drain(ctx *fasthttp.RequestCtx) {
	if ctx.Request.IsBodyStream() {
		_, _ = io.Copy(io.Discard, ctx.RequestBodyStream())
	}
}

// TestStalledBody: a client that announces 4096 bytes of body, sends 10
// and stops gets 408 after egress.timeouts.body_idle, counted, and the
// target's breaker hears nothing of it.
func TestStalledBody(t *testing.T) {
	up := fasttest.StartUpstream(t, drain)
	f := start(t, egressPolicy("  allow_unlisted: false\n  timeouts: {header: 10s, body_idle: 200ms, idle: 10s}",
		"targets:\n"+target("api", []string{"api.test"}, "http://"+up.Addr, "circuit_breaker: { enabled: true, failure_ratio: 0.5, minimum_requests: 2, window: 30s, open: 5s }")), nil)
	for range 2 {
		resp, _ := fasttest.Raw(t, f.addr, "POST http://api.test/ HTTP/1.1\r\nHost: api.test\r\nContent-Length: 4096\r\n\r\n0123456789")
		if resp.StatusCode != fasthttp.StatusRequestTimeout {
			t.Fatalf("stalled body: %d, want 408", resp.StatusCode)
		}
	}
	if n := fasttest.Value(f.gov.Metrics.ListenerTimeouts.WithLabelValues("egress", "body_idle")); n != 2 {
		t.Fatalf("body_idle timeouts counted: %v, want 2", n)
	}
	if r := f.do(t, "GET", "http://api.test/", nil); r.status != 200 {
		t.Fatalf("after two stalled clients the target answers %d (%s): its breaker opened", r.status, r.body)
	}
}

// TestTrickledUploadCutAtTargetTimeout: a body that keeps moving, each gap
// far under body_idle, is still cut when the target's timeout passes:
// the timeout bounds the whole exchange, the upload included.
func TestTrickledUploadCutAtTargetTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	up := fasttest.StartUpstream(t, drain)
	f := start(t, egressPolicy("  allow_unlisted: false\n  timeouts: {header: 10s, body_idle: 5s, idle: 10s}",
		"targets:\n"+target("api", []string{"api.test"}, "http://"+up.Addr, "timeout: 300ms")), nil)
	begin := time.Now()
	c := fasttest.Send(t, f.addr, "POST http://api.test/ HTTP/1.1\r\nHost: api.test\r\nContent-Length: 4096\r\n\r\nx")
	defer c.Close()
	stop := make(chan struct{})
	trickled := make(chan struct{})
	go func() {
		defer close(trickled)
		tick := time.NewTicker(20 * time.Millisecond) // the client's pace, not a wait
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if _, err := c.Write([]byte("x")); err != nil {
					return
				}
			}
		}
	}()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	close(stop)
	<-trickled
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	waited := time.Since(begin)
	if resp.StatusCode != fasthttp.StatusGatewayTimeout || resp.Header.Get(control.Header) != string(control.Timeout) {
		t.Fatalf("trickled upload: %d %q, want 504 timeout", resp.StatusCode, resp.Header.Get(control.Header))
	}
	if waited < timeout*9/10 || waited > 4*time.Second {
		t.Fatalf("cut after %v, want about the target's timeout (%v)", waited, timeout)
	}
}
