package grpcegress

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/warden-dev/warden/internal/testkit/fasttest"
)

// TestStalledStreamIsCut: a client that opens a bidirectional stream,
// sends one message and then nothing more has its stream ended after
// egress.timeouts.body_idle, with DEADLINE_EXCEEDED, counted; the target
// is not blamed (its breaker, one failure from open, lets the next call
// through).
func TestStalledStreamIsCut(t *testing.T) {
	_, addr := startEcho(t)
	f := start(t, grpcPolicy("  allow_unlisted: false\n  timeouts: {header: 10s, body_idle: 200ms, idle: 10s}",
		echoTarget(addr, "circuit_breaker: { enabled: true, failure_ratio: 0.5, minimum_requests: 1, window: 30s, open: 5s }")))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // a failure bound
	defer cancel()
	stream, err := f.conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, "/test.v1.Echo/Chat")
	if err != nil {
		t.Fatal(err)
	}
	in := []byte("hello")
	if err := stream.SendMsg(&in); err != nil {
		t.Fatal(err)
	}
	var out []byte
	if err := stream.RecvMsg(&out); err != nil || string(out) != "re:hello" {
		t.Fatalf("first message: %q %v", out, err)
	}
	begin := time.Now()
	err = stream.RecvMsg(&out) // the client sends nothing more
	st := status.Convert(err)
	if st.Code() != codes.DeadlineExceeded || !strings.Contains(st.Message(), "stalled") {
		t.Fatalf("stalled stream ended with %v, want DEADLINE_EXCEEDED for the stall", err)
	}
	if waited := time.Since(begin); waited > 5*time.Second {
		t.Fatalf("cut after %v", waited)
	}
	if n := fasttest.Value(f.gov.Metrics.ListenerTimeouts.WithLabelValues("grpc", "body_idle")); n != 1 {
		t.Fatalf("body_idle timeouts counted: %v, want 1", n)
	}
	if out, err := f.call(context.Background(), "after"); err != nil || out != "echo:after" {
		t.Fatalf("the call after the stall: %q %v (the breaker blamed the target)", out, err)
	}
}
