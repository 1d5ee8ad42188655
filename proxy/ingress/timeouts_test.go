package ingress

import (
	"io"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warden-dev/warden/internal/testkit/fasttest"
)

// TestSlowClientTimeouts: ingress.timeouts bound a slow client: a head
// that stalls gets 408 after header, a body that stops coming (a head
// announcing 4096 bytes, 10 of them, then nothing) gets 408 after
// body_idle, whatever the worker does, and each is counted.
func TestSlowClientTimeouts(t *testing.T) {
	const short = 200 * time.Millisecond
	tests := []struct {
		name, raw, reason string
	}{
		{"stalled head", "GET / HTTP/1.1\r\nHost: a\r\n", "header"},
		{"stalled body", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4096\r\n\r\n0123456789", "body_idle"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := start(t, "  timeouts: {header: 200ms, body_idle: 200ms, idle: 10s}", func(ctx *fasthttp.RequestCtx) {
				if ctx.Request.IsBodyStream() {
					_, _ = io.Copy(io.Discard, ctx.RequestBodyStream())
				}
			})
			begin := time.Now()
			resp, _ := fasttest.Raw(t, f.addr, tt.raw)
			if resp.StatusCode != fasthttp.StatusRequestTimeout {
				t.Fatalf("%s: %d, want 408", tt.name, resp.StatusCode)
			}
			if waited := time.Since(begin); waited < short*9/10 {
				t.Fatalf("408 after %v, before the timeout", waited)
			}
			if n := fasttest.Value(f.gov.Metrics.ListenerTimeouts.WithLabelValues("ingress", tt.reason)); n != 1 {
				t.Fatalf("%s timeouts counted: %v, want 1", tt.reason, n)
			}
		})
	}
}
