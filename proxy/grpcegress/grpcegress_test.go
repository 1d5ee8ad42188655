package grpcegress

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/warden-dev/warden/governor"
	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/internal/testkit/fasttest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, fasttest.LeakOptions()...) }

// rawCodec passes messages as bytes, so the test service needs no protoc.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "raw" }

// echo is the test service test.v1.Echo: Echo answers "echo:<in>", or the
// status "fail:<code>" asks for, or UNAVAILABLE to the first n calls of
// "flaky:<n>", or waits for "block" to be released;
// Stream sends as many messages as its input says.
type echo struct {
	calls   atomic.Int64
	flaky   atomic.Int64                // calls "flaky:<n>" has made
	md      atomic.Pointer[metadata.MD] // the last unary call's
	release chan struct{}
	entered chan struct{}
}

var echoDesc = grpc.ServiceDesc{
	ServiceName: "test.v1.Echo",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Echo",
		Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			var in []byte
			if err := dec(&in); err != nil {
				return nil, err
			}
			return srv.(*echo).unary(ctx, string(in))
		},
	}},
	Streams: []grpc.StreamDesc{{
		StreamName:    "Chat",
		ServerStreams: true,
		ClientStreams: true,
		Handler: func(srv any, stream grpc.ServerStream) error {
			for {
				var in []byte
				if err := stream.RecvMsg(&in); err == io.EOF {
					return nil
				} else if err != nil {
					return err
				}
				out := append([]byte("re:"), in...)
				if err := stream.SendMsg(&out); err != nil {
					return err
				}
			}
		},
	}, {
		StreamName:    "Stream",
		ServerStreams: true,
		Handler: func(srv any, stream grpc.ServerStream) error {
			srv.(*echo).calls.Add(1)
			var in []byte
			if err := stream.RecvMsg(&in); err != nil {
				return err
			}
			n, _ := strconv.Atoi(string(in))
			for i := range n {
				msg := []byte(fmt.Sprintf("msg %d", i))
				if err := stream.SendMsg(&msg); err != nil {
					return err
				}
			}
			stream.SetTrailer(metadata.Pairs("x-sent", strconv.Itoa(n)))
			return nil
		},
	}},
}

func (e *echo) unary(ctx context.Context, in string) (*[]byte, error) {
	e.calls.Add(1)
	md, _ := metadata.FromIncomingContext(ctx)
	e.md.Store(&md)
	if c, ok := strings.CutPrefix(in, "flaky:"); ok {
		if e.flaky.Add(1) <= int64(leadingInt(c)) {
			return nil, status.Error(codes.Unavailable, "flaky: not yet")
		}
	}
	if c, ok := strings.CutPrefix(in, "fail:"); ok {
		return nil, status.Error(codes.Code(leadingInt(c)), "asked to fail: "+in)
	}
	if in == "block" {
		e.entered <- struct{}{}
		select {
		case <-e.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	_ = grpc.SetTrailer(ctx, metadata.Pairs("x-echo-trailer", "kept"))
	out := []byte("echo:" + in)
	return &out, nil
}

// leadingInt is the number s begins with (0 if none).
func leadingInt(s string) int {
	n := 0
	for i := 0; i < len(s) && s[i] >= '0' && s[i] <= '9'; i++ {
		n = n*10 + int(s[i]-'0')
	}
	return n
}

func startEcho(t *testing.T, opts ...grpc.ServerOption) (*echo, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &echo{release: make(chan struct{}), entered: make(chan struct{}, 16)}
	s := grpc.NewServer(append(opts, grpc.ForceServerCodec(rawCodec{}))...)
	s.RegisterService(&echoDesc, e)
	go s.Serve(ln)
	t.Cleanup(s.Stop)
	return e, ln.Addr().String()
}

type fixture struct {
	g    *Grpc
	gov  *fasttest.Governor
	clk  *clock.Fake
	conn *grpc.ClientConn
}

var t0 = time.Date(2026, 3, 2, 10, 0, 20, 0, time.UTC)

func start(t *testing.T, yaml string, dialOpts ...grpc.DialOption) *fixture {
	t.Helper()
	clk := clock.NewFake(t0)
	gov, ctl := fasttest.NewGovernor(t, clk, yaml)
	return startOn(t, clk, gov, ctl, dialOpts...)
}

// startOn serves the controls ctl of gov, whose clock is clk.
func startOn(t *testing.T, clk *clock.Fake, gov *fasttest.Governor, ctl *governor.Controls, dialOpts ...grpc.DialOption) *fixture {
	t.Helper()
	f := &fixture{clk: clk, gov: gov}
	f.g = New(Options{Clock: f.clk, Metrics: gov.Metrics})
	if err := f.g.Apply(context.Background(), ctl); err != nil {
		t.Fatal(err)
	}
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})),
	}, dialOpts...)
	conn, err := grpc.NewClient(f.g.Addr(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	f.conn = conn
	t.Cleanup(func() {
		conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := f.g.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return f
}

func grpcPolicy(egress, targets string) string {
	return "version: 1\negress:\n  grpc_listen: 127.0.0.1:0\n" + egress + "\ntargets:\n" + targets
}

func echoTarget(addr, extra string) string {
	s := "  - name: echo\n    grpc_service: test.v1.Echo\n    upstream: h2c://" + addr + "\n"
	for _, line := range strings.Split(strings.TrimSpace(extra), "\n") {
		if line != "" {
			s += "    " + strings.TrimSpace(line) + "\n"
		}
	}
	return s
}

func (f *fixture) call(ctx context.Context, in string, opts ...grpc.CallOption) (string, error) {
	req, out := []byte(in), []byte(nil)
	err := f.conn.Invoke(ctx, "/test.v1.Echo/Echo", &req, &out, opts...)
	return string(out), err
}

func TestUnaryAndTrailers(t *testing.T) {
	e, addr := startEcho(t)
	f := start(t, grpcPolicy("  allow_unlisted: false", echoTarget(addr, "")))
	var trailer metadata.MD
	out, err := f.call(context.Background(), "hi", grpc.Trailer(&trailer))
	if err != nil || out != "echo:hi" {
		t.Fatalf("%q %v", out, err)
	}
	if got := trailer.Get("x-echo-trailer"); len(got) != 1 || got[0] != "kept" {
		t.Fatalf("trailers lost: %v", trailer)
	}
	// A status from the upstream passes through.
	_, err = f.call(context.Background(), "fail:5")
	if status.Code(err) != codes.NotFound {
		t.Fatalf("status %v", err)
	}
	if e.calls.Load() != 2 {
		t.Fatalf("upstream saw %d calls", e.calls.Load())
	}
	if n := fasttest.Value(f.gov.Metrics.Requests.WithLabelValues("grpc", "echo", "0")); n != 1 {
		t.Fatalf("warden_requests_total{grpc,echo,0} = %v", n)
	}
	if n := fasttest.Value(f.gov.Metrics.Requests.WithLabelValues("grpc", "echo", "5")); n != 1 {
		t.Fatalf("warden_requests_total{grpc,echo,5} = %v", n)
	}
}

func TestServerStreaming(t *testing.T) {
	_, addr := startEcho(t)
	f := start(t, grpcPolicy("  allow_unlisted: false", echoTarget(addr, "")))
	stream, err := f.conn.NewStream(context.Background(), &grpc.StreamDesc{ServerStreams: true}, "/test.v1.Echo/Stream")
	if err != nil {
		t.Fatal(err)
	}
	in := []byte("25")
	if err := stream.SendMsg(&in); err != nil {
		t.Fatal(err)
	}
	stream.CloseSend()
	var got []string
	for {
		var msg []byte
		err := stream.RecvMsg(&msg)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, string(msg))
	}
	if len(got) != 25 || got[24] != "msg 24" {
		t.Fatalf("received %d messages: %v", len(got), got)
	}
	if tr := stream.Trailer().Get("x-sent"); len(tr) != 1 || tr[0] != "25" {
		t.Fatalf("stream trailer: %v", stream.Trailer())
	}
}

// TestBidiStreaming: each message is answered before the next is sent, so
// the proxy must pass both directions through at once.
func TestBidiStreaming(t *testing.T) {
	_, addr := startEcho(t)
	f := start(t, grpcPolicy("  allow_unlisted: false", echoTarget(addr, "")))
	stream, err := f.conn.NewStream(context.Background(), &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, "/test.v1.Echo/Chat")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		msg := []byte(fmt.Sprint(i))
		if err := stream.SendMsg(&msg); err != nil {
			t.Fatal(err)
		}
		var reply []byte
		if err := stream.RecvMsg(&reply); err != nil {
			t.Fatal(err)
		}
		if string(reply) != fmt.Sprintf("re:%d", i) {
			t.Fatalf("reply %q to %d", reply, i)
		}
	}
	stream.CloseSend()
	var extra []byte
	if err := stream.RecvMsg(&extra); !errors.Is(err, io.EOF) {
		t.Fatalf("end of stream: %v", err)
	}
}

const grpcBreaker = "circuit_breaker: { enabled: true, failure_ratio: 0.5, minimum_requests: 4, open: 5s }"

func TestBreakerOpensOnUnavailableNotInvalidArgument(t *testing.T) {
	e, addr := startEcho(t)
	f := start(t, grpcPolicy("  allow_unlisted: false", echoTarget(addr, grpcBreaker)))
	for range 20 {
		if _, err := f.call(context.Background(), "fail:3"); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("INVALID_ARGUMENT: %v", err)
		}
	}
	if e.calls.Load() != 20 {
		t.Fatalf("INVALID_ARGUMENT opened the breaker: %d calls reached the upstream", e.calls.Load())
	}
	for range 4 {
		if _, err := f.call(context.Background(), "fail:14"); status.Code(err) != codes.Unavailable {
			t.Fatalf("UNAVAILABLE: %v", err)
		}
	}
	// 4 failures out of 24 are below the ratio; keep failing until it opens.
	for e.calls.Load() < 100 {
		var trailer metadata.MD
		before := e.calls.Load()
		_, err := f.call(context.Background(), "fail:14", grpc.Trailer(&trailer))
		if e.calls.Load() == before {
			if status.Code(err) != codes.Unavailable || strings.Join(trailer.Get("x-warden-control"), ",") != "circuit_breaker" {
				t.Fatalf("fast failure: %v, trailer %v", err, trailer)
			}
			if !strings.Contains(status.Convert(err).Message(), "circuit breaker of echo is open") {
				t.Fatalf("message %q", status.Convert(err).Message())
			}
			return
		}
	}
	t.Fatal("breaker never opened on UNAVAILABLE")
}

func TestCancelledCallIsNeutral(t *testing.T) {
	e, addr := startEcho(t)
	f := start(t, grpcPolicy("  allow_unlisted: false", echoTarget(addr, "circuit_breaker: { enabled: true, failure_ratio: 0.5, minimum_requests: 1 }")))
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := f.call(ctx, "block")
		errc <- err
	}()
	<-e.entered
	cancel()
	if err := <-errc; status.Code(err) != codes.Canceled {
		t.Fatalf("cancelled call: %v", err)
	}
	// The breaker saw neither a success nor a failure.
	fasttest.WaitFor(t, "the call to end at the proxy", func() bool {
		return fasttest.Value(f.gov.Metrics.Requests.WithLabelValues("grpc", "echo", "1")) == 1
	})
	snap := f.gov.Current().Targets["echo"].Breaker.Snapshot()
	if snap.Requests != 0 || snap.State != "closed" {
		t.Fatalf("a cancelled call counted: %+v", snap)
	}
}

// TestCancelledWhileQueued: a call its client cancels while it waits in a
// pool's queue was refused by nobody: no pool_queue refusal is counted, it
// is recorded as CANCELLED, and it never reaches the upstream.
func TestCancelledWhileQueued(t *testing.T) {
	e, addr := startEcho(t)
	f := start(t, grpcPolicy("  allow_unlisted: false", echoTarget(addr, "pools: [one]"))+
		"pools:\n  one: { concurrency: 1, queue: 5, max_wait: 30s }\n")
	errc := make(chan error, 1)
	go func() {
		_, err := f.call(context.Background(), "block")
		errc <- err
	}()
	<-e.entered
	ctx, cancel := context.WithCancel(context.Background())
	queuedErr := make(chan error, 1)
	go func() {
		_, err := f.call(ctx, "queued")
		queuedErr <- err
	}()
	fasttest.WaitFor(t, "the second call to queue", func() bool {
		return fasttest.Value(f.gov.Metrics.PoolQueued.WithLabelValues("one")) == 1
	})
	cancel()
	if err := <-queuedErr; status.Code(err) != codes.Canceled {
		t.Fatalf("cancelled call: %v", err)
	}
	fasttest.WaitFor(t, "the cancelled call to be recorded", func() bool {
		return fasttest.Value(f.gov.Metrics.Requests.WithLabelValues("grpc", "echo", "1")) == 1
	})
	close(e.release)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if n := fasttest.Value(f.gov.Metrics.Rejections.WithLabelValues("pool_queue", "one")); n != 0 {
		t.Fatalf("rejections{pool_queue,one} = %v for a call the client cancelled", n)
	}
	if n := fasttest.Value(f.gov.Metrics.Requests.WithLabelValues("grpc", "echo", "14")); n != 0 {
		t.Fatalf("requests{grpc,echo,14} = %v", n)
	}
	if n := e.calls.Load(); n != 1 {
		t.Fatalf("upstream saw %d calls; the cancelled one must not reach it", n)
	}
}

// TestNoAcceptEncodingAdded: the caller's headers go upstream as sent; Go's
// transport would otherwise add Accept-Encoding: gzip and decode the answer.
func TestNoAcceptEncodingAdded(t *testing.T) {
	e, addr := startEcho(t)
	f := start(t, grpcPolicy("  allow_unlisted: false", echoTarget(addr, "")))
	if _, err := f.call(context.Background(), "x"); err != nil {
		t.Fatal(err)
	}
	if got := (*e.md.Load())["accept-encoding"]; len(got) != 0 {
		t.Fatalf("upstream saw accept-encoding %q the caller did not send", got)
	}
	if _, err := f.call(metadata.AppendToOutgoingContext(context.Background(), "accept-encoding", "identity"), "x"); err != nil {
		t.Fatal(err)
	}
	if got := (*e.md.Load())["accept-encoding"]; len(got) != 1 || got[0] != "identity" {
		t.Fatalf("the caller's accept-encoding arrived as %q", got)
	}
}

// TestRefusedStreamsResent: a new connection assumes 100 streams until the
// upstream's SETTINGS arrive, so a burst at an upstream allowing fewer is
// partly refused (REFUSED_STREAM). Those calls were never processed: they
// are sent again, bodies included, and reach the upstream; none fails and
// the breaker hears of no failure.
func TestRefusedStreamsResent(t *testing.T) {
	const calls = 8
	e, addr := startEcho(t, grpc.MaxConcurrentStreams(calls/2))
	f := start(t, grpcPolicy("  allow_unlisted: false", echoTarget(addr, "circuit_breaker: { enabled: true, failure_ratio: 0.5, minimum_requests: 1 }")))
	errc := make(chan error, calls)
	for range calls {
		go func() {
			out, err := f.call(context.Background(), "block")
			if err == nil && out != "echo:block" {
				err = fmt.Errorf("answer %q", out)
			}
			errc <- err
		}()
	}
	for range calls {
		select {
		case <-e.entered:
		case err := <-errc:
			t.Fatalf("a call of the burst ended before reaching the upstream: %v", err)
		}
	}
	close(e.release)
	for range calls {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	if snap := f.gov.Current().Targets["echo"].Breaker.Snapshot(); snap.Failures != 0 || snap.State != "closed" {
		t.Fatalf("breaker after the burst: %+v", snap)
	}
}

func TestPoolAndTenantFastFail(t *testing.T) {
	e, addr := startEcho(t)
	f := start(t, grpcPolicy("  allow_unlisted: false\n  tenant: { header: x-tenant-id, rate: 3, window: 60 }",
		echoTarget(addr, "pools: [one]"))+"pools:\n  one: { concurrency: 1 }\n")
	errc := make(chan error, 1)
	go func() {
		_, err := f.call(metadata.AppendToOutgoingContext(context.Background(), "x-tenant-id", "acme"), "block")
		errc <- err
	}()
	<-e.entered
	var trailer metadata.MD
	_, err := f.call(metadata.AppendToOutgoingContext(context.Background(), "x-tenant-id", "acme"), "x", grpc.Trailer(&trailer))
	if status.Code(err) != codes.ResourceExhausted || strings.Join(trailer.Get("x-warden-control"), ",") != "pool_queue" {
		t.Fatalf("pool full: %v %v", err, trailer)
	}
	close(e.release)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if _, err := f.call(metadata.AppendToOutgoingContext(context.Background(), "x-tenant-id", "acme"), "x"); err != nil {
		t.Fatal(err)
	}
	_, err = f.call(metadata.AppendToOutgoingContext(context.Background(), "x-tenant-id", "acme"), "x", grpc.Trailer(&trailer))
	if status.Code(err) != codes.ResourceExhausted || strings.Join(trailer.Get("x-warden-control"), ",") != "tenant_rate" {
		t.Fatalf("tenant cap: %v %v", err, trailer)
	}
	if n := fasttest.Value(f.gov.Metrics.Rejections.WithLabelValues("tenant_rate", "grpc")); n != 1 {
		t.Fatalf("rejections{tenant_rate,grpc} = %v", n)
	}
}

// The gRPC egress shares the egress's tenant caps, overflow window
// included.
func TestTenantOverflow(t *testing.T) {
	_, addr := startEcho(t)
	f := start(t, grpcPolicy("  allow_unlisted: false\n  tenant: { header: x-tenant-id, rate: 1, window: 60, max_keys: 1 }",
		echoTarget(addr, "")))
	call := func(tenant string, opts ...grpc.CallOption) error {
		_, err := f.call(metadata.AppendToOutgoingContext(context.Background(), "x-tenant-id", tenant), "x", opts...)
		return err
	}
	for _, tenant := range []string{"a", "b"} {
		if err := call(tenant); err != nil {
			t.Fatalf("tenant %s: %v", tenant, err)
		}
	}
	var trailer metadata.MD
	err := call("c", grpc.Trailer(&trailer))
	if status.Code(err) != codes.ResourceExhausted || strings.Join(trailer.Get("x-warden-control"), ",") != "tenant_rate" ||
		!strings.Contains(status.Convert(err).Message(), "tenant_overflow") {
		t.Fatalf("tenant c past the overflow window: %v %v", err, trailer)
	}
	if n := fasttest.Value(f.gov.Metrics.TenantOverflow.WithLabelValues("egress")); n != 2 {
		t.Fatalf("warden_tenant_overflow_total{egress} = %v, want 2", n)
	}
}

func TestTimeoutAndUpstreamDown(t *testing.T) {
	e, addr := startEcho(t)
	f := start(t, grpcPolicy("  allow_unlisted: false", echoTarget(addr, "timeout: 100ms")))
	var trailer metadata.MD
	_, err := f.call(context.Background(), "block", grpc.Trailer(&trailer))
	<-e.entered
	if status.Code(err) != codes.DeadlineExceeded || strings.Join(trailer.Get("x-warden-control"), ",") != "timeout" {
		t.Fatalf("timeout: %v %v", err, trailer)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := ln.Addr().String()
	ln.Close()
	g := start(t, grpcPolicy("  allow_unlisted: false", echoTarget(dead, "")))
	_, err = g.call(context.Background(), "x", grpc.Trailer(&trailer))
	if status.Code(err) != codes.Unavailable || strings.Join(trailer.Get("x-warden-control"), ",") != "upstream" {
		t.Fatalf("upstream down: %v %v", err, trailer)
	}
}

func TestRoutingByAuthorityAndUnlisted(t *testing.T) {
	e, addr := startEcho(t)
	yaml := grpcPolicy("  allow_unlisted: false", "  - name: api\n    hosts: [api.test]\n    upstream: http://"+addr+"\n")
	byAuthority := start(t, yaml, grpc.WithAuthority("api.test"))
	if out, err := byAuthority.call(context.Background(), "x"); err != nil || out != "echo:x" {
		t.Fatalf("by :authority: %q %v", out, err)
	}
	other := start(t, yaml, grpc.WithAuthority("other.test"))
	var trailer metadata.MD
	_, err := other.call(context.Background(), "x", grpc.Trailer(&trailer))
	if status.Code(err) != codes.PermissionDenied || strings.Join(trailer.Get("x-warden-control"), ",") != "allow_unlisted" {
		t.Fatalf("unlisted: %v %v", err, trailer)
	}
	if e.calls.Load() != 1 {
		t.Fatalf("upstream saw %d calls", e.calls.Load())
	}
}

func TestServiceOf(t *testing.T) {
	for path, want := range map[string]string{
		"/payments.v1.Payments/Charge": "payments.v1.Payments",
		"/a/b":                         "a",
		"/a/":                          "",
		"//b":                          "",
		"/a/b/c":                       "",
		"a/b":                          "",
		"":                             "",
	} {
		if got := serviceOf(path); got != want {
			t.Errorf("serviceOf(%q) = %q, want %q", path, got, want)
		}
	}
}

// FuzzServiceOf checks the :path parsing that picks a gRPC target: a
// service is returned only for "/<service>/<method>", and it is exactly
// the part between the slashes.
func FuzzServiceOf(f *testing.F) {
	for _, s := range []string{"/payments.v1.Payments/Charge", "/a/b", "//", "/a/b/c", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, path string) {
		svc := serviceOf(path)
		if svc == "" {
			return
		}
		method, ok := strings.CutPrefix(path, "/"+svc+"/")
		if !ok || method == "" || strings.Contains(method, "/") || strings.Contains(svc, "/") {
			t.Fatalf("serviceOf(%q) = %q", path, svc)
		}
	})
}

// TestCallToItselfRefused: a client dialling the egress names it in
// :authority; an unlisted call forwarded there would come straight back,
// again and again, until its timeout. It is refused at once instead.
func TestCallToItselfRefused(t *testing.T) {
	f := start(t, grpcPolicy("  allow_unlisted: true", "  - name: other\n    grpc_service: other.v1.Other\n"))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := f.call(ctx, "x")
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "egress listener itself") {
		t.Fatalf("call to the listener itself: %v", err)
	}
	if n := fasttest.Value(f.gov.Metrics.Requests.WithLabelValues("grpc", "_unlisted", "3")); n != 1 {
		t.Fatalf("warden_requests_total{grpc,_unlisted,3} = %v: the call looped", n)
	}
}

// TestTimeoutBoundsPoolWait: a call waiting in a pool's queue ends with
// DEADLINE_EXCEEDED when its target's timeout passes, without reaching
// the upstream, and the target's breaker hears nothing of the wait.
func TestTimeoutBoundsPoolWait(t *testing.T) {
	e, addr := startEcho(t)
	f := start(t, grpcPolicy("  allow_unlisted: false",
		"  - name: held\n    hosts: [held.test]\n    upstream: http://"+addr+"\n    timeout: 0s\n    pools: [one]\n"+
			"  - name: quick\n    hosts: [quick.test]\n    upstream: http://"+addr+"\n    timeout: 200ms\n    pools: [one]\n"+
			"    circuit_breaker: { enabled: true, failure_ratio: 0.5, minimum_requests: 1 }\n")+
		"pools:\n  one: { concurrency: 1, queue: 5, max_wait: 30s }\n")
	errc := make(chan error, 1)
	go func() {
		_, err := f.call(context.Background(), "block", grpc.CallAuthority("held.test"))
		errc <- err
	}()
	<-e.entered
	defer func() { close(e.release); <-errc }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // a failure bound
	defer cancel()
	var trailer metadata.MD
	_, err := f.call(ctx, "x", grpc.CallAuthority("quick.test"), grpc.Trailer(&trailer))
	if status.Code(err) != codes.DeadlineExceeded || strings.Join(trailer.Get("x-warden-control"), ",") != "timeout" {
		t.Fatalf("queued past its timeout: %v %v", err, trailer)
	}
	if n := e.calls.Load(); n != 1 {
		t.Fatalf("upstream saw %d calls; the timed-out one must not reach it", n)
	}
	if snap := f.gov.Current().Targets["quick"].Breaker.Snapshot(); snap.Requests != 0 {
		t.Fatalf("the breaker counted the wait in warden's own queue: %+v", snap)
	}
}

// TestShutdownCutsCallsOfAMovedListener: a call still running on the
// listener a reload moved away from is cut when shutdown's grace ends,
// like the calls on the current listener.
func TestShutdownCutsCallsOfAMovedListener(t *testing.T) {
	e, addr := startEcho(t)
	yaml := grpcPolicy("  allow_unlisted: false", echoTarget(addr, "timeout: 0s"))
	f := start(t, yaml)
	errc := make(chan error, 1)
	go func() {
		_, err := f.call(context.Background(), "block")
		errc <- err
	}()
	<-e.entered
	if err := f.g.Apply(context.Background(), f.gov.Load(t, strings.Replace(yaml, "127.0.0.1:0", "localhost:0", 1))); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_ = f.g.Shutdown(ctx)
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("the blocked call succeeded")
		}
	case <-time.After(10 * time.Second): // a failure bound
		close(e.release)
		<-errc
		t.Fatal("Shutdown returned with a call still running on the old listener")
	}
}

// TestFailedRebindBuildsNothing: a reload that moves the listener to an
// address already taken fails before its routes are built, so it adds no
// transport for settings it never applied, and calls keep their route.
func TestFailedRebindBuildsNothing(t *testing.T) {
	_, addr := startEcho(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	yaml := grpcPolicy("  allow_unlisted: false", echoTarget(addr, "max_connections: 4"))
	f := start(t, yaml)
	old := f.g.table.Load()
	moved := strings.Replace(strings.Replace(yaml, "max_connections: 4", "max_connections: 8", 1),
		"127.0.0.1:0", taken.Addr().String(), 1)
	if err := f.g.Apply(context.Background(), f.gov.Load(t, moved)); err == nil {
		t.Fatal("a reload onto a taken address succeeded")
	}
	f.g.mu.Lock()
	transports := len(f.g.transports)
	f.g.mu.Unlock()
	if transports != 1 || f.g.table.Load() != old {
		t.Fatalf("the failed reload left %d transports or swapped the table", transports)
	}
	if out, err := f.call(context.Background(), "hi"); err != nil || out != "echo:hi" {
		t.Fatalf("after the failed reload: %q %v", out, err)
	}
}

// TestBackendDownIsResourceExhausted: with a fail_closed shared backend
// out of reach, the tenant cap refuses with RESOURCE_EXHAUSTED (HTTP's 429)
// and control upstream, saying the backend is the cause, not a reached cap.
func TestBackendDownIsResourceExhausted(t *testing.T) {
	_, addr := startEcho(t)
	clk := clock.NewFake(t0)
	g, ctl := fasttest.NewGovernorBackendDown(t, clk, grpcPolicy("  tenant: { header: x-tenant-id, rate: 3, window: 1 }", echoTarget(addr, "")))
	f := startOn(t, clk, g, ctl)
	var trailer metadata.MD
	_, err := f.call(context.Background(), "hi", grpc.Trailer(&trailer))
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted || strings.Join(trailer.Get("x-warden-control"), ",") != "upstream" ||
		!strings.Contains(st.Message(), "backend unreachable") || strings.Contains(st.Message(), "reached") {
		t.Fatalf("backend down: %v, trailer %v", err, trailer)
	}
}

// TestOwnDeadlineIsNeutral: a call whose own deadline (grpc-timeout) has
// passed when the upstream breaks off the stream is neutral: the upstream,
// told that deadline, resets the stream, and its reset may reach warden
// before the client's cancel does. The client here never cancels, so the
// reset always comes first.
func TestOwnDeadlineIsNeutral(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Protocols: new(http.Protocols), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		dl, _ := callDeadline(r.Header.Get("Grpc-Timeout"), time.Now())
		time.Sleep(time.Until(dl) + 20*time.Millisecond) // past the deadline it was told
		panic(http.ErrAbortHandler)                      // RST_STREAM
	})}
	srv.Protocols.SetUnencryptedHTTP2(true)
	go srv.Serve(ln)
	defer srv.Close()
	f := start(t, grpcPolicy("  allow_unlisted: false", echoTarget(ln.Addr().String(), "circuit_breaker: { enabled: true, failure_ratio: 0.5, minimum_requests: 1 }")))
	var tr http.Transport
	tr.Protocols = new(http.Protocols)
	tr.Protocols.SetUnencryptedHTTP2(true)
	defer tr.CloseIdleConnections()
	req, err := http.NewRequest("POST", "http://"+f.g.Addr()+"/test.v1.Echo/Echo", bytes.NewReader(append([]byte{0, 0, 0, 0, 2}, "hi"...)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("TE", "trailers")
	req.Header.Set("Grpc-Timeout", "50m")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if code := resp.Header.Get("Grpc-Status") + resp.Trailer.Get("Grpc-Status"); code != "4" {
		t.Fatalf("grpc-status %q (%s), want 4", code, resp.Header.Get("Grpc-Message")+resp.Trailer.Get("Grpc-Message"))
	}
	snap := f.gov.Current().Targets["echo"].Breaker.Snapshot()
	if snap.Requests != 0 || snap.State != "closed" {
		t.Fatalf("a call past its own deadline counted: %+v", snap)
	}
	if n := fasttest.Value(f.gov.Metrics.Rejections.WithLabelValues("upstream", "echo")); n != 0 {
		t.Fatalf("rejections{upstream,echo} = %v", n)
	}
}

func TestDeadlinePassed(t *testing.T) {
	start := time.Unix(1000, 0)
	tests := []struct {
		header  string
		elapsed time.Duration
		want    bool
	}{
		{"", time.Hour, false},
		{"100m", 99 * time.Millisecond, false},
		{"100m", 100 * time.Millisecond, true},
		{"1S", 2 * time.Second, true},
		{"5M", time.Minute, false},
		{"2H", 3 * time.Hour, true},
		{"1000u", time.Millisecond, true},
		{"999999999n", time.Hour, false}, // 9 digits: malformed
		{"10x", time.Hour, false},
		{"m", time.Hour, false},
		{"-1S", time.Hour, false},
		{"99999999H", time.Hour, false},
	}
	for _, tc := range tests {
		if got := deadlinePassed(tc.header, start, start.Add(tc.elapsed)); got != tc.want {
			t.Errorf("deadlinePassed(%q, +%v) = %v, want %v", tc.header, tc.elapsed, got, tc.want)
		}
	}
}
