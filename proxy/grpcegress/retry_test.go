package grpcegress

import (
	"bytes"
	"context"
	"io"
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/warden-dev/warden/internal/testkit/fasttest"
	"github.com/warden-dev/warden/internal/testkit/loopback"
)

const grpcRetry = "retry: { count: 2, logic: fixed, delay: 0s, budget: 1, non_retryable: [do not retry] }"

// goCall makes the call in the background; its error comes on the channel.
func (f *fixture) goCall(ctx context.Context, in string) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := f.call(ctx, in)
		done <- err
	}()
	return done
}

func keyed(key string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), "idempotency-key", key)
}

// TestRetries: a failure the client has seen nothing of is retried when
// the call carries an idempotency-key, as the policy says, and never past
// it.
func TestRetries(t *testing.T) {
	tests := []struct {
		name      string
		ctx       context.Context
		in        string
		want      codes.Code
		calls     int64 // reaching the upstream
		retries   float64
		bodyBytes int // padding to the request
	}{
		{"recovers", keyed("k1"), "flaky:2", codes.OK, 3, 2, 0},
		{"gives up after count", keyed("k2"), "flaky:5", codes.Unavailable, 3, 2, 0},
		{"without a key, once", context.Background(), "flaky:1", codes.Unavailable, 1, 0, 0},
		{"not a failure", keyed("k3"), "fail:3", codes.InvalidArgument, 1, 0, 0},
		{"a timeout the upstream reports", keyed("k4"), "fail:4", codes.DeadlineExceeded, 1, 0, 0},
		{"non_retryable", keyed("k5"), "fail:13:do not retry", codes.Internal, 1, 0, 0},
		{"a body past 1 MiB", keyed("k6"), "flaky:1", codes.Unavailable, 1, 0, 1<<20 + 1},
		{"a body within 1 MiB", keyed("k7"), "flaky:1", codes.OK, 2, 1, 1 << 19},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, addr := startEcho(t, grpc.MaxRecvMsgSize(4<<20))
			f := start(t, grpcPolicy("  allow_unlisted: false", echoTarget(addr, grpcRetry)))
			in := tt.in
			if tt.bodyBytes > 0 {
				in += "|" + strings.Repeat("x", tt.bodyBytes)
			}
			out, err := f.call(tt.ctx, in)
			if status.Code(err) != tt.want {
				t.Fatalf("status %v, want %v", err, tt.want)
			}
			if tt.want == codes.OK && out != "echo:"+in {
				t.Fatalf("answer %.40q", out)
			}
			if n := e.calls.Load(); n != tt.calls {
				t.Fatalf("upstream saw %d calls, want %d", n, tt.calls)
			}
			if n := fasttest.Value(f.gov.Metrics.Retries.WithLabelValues("echo")); n != tt.retries {
				t.Fatalf("warden_retries_total{echo} = %v, want %v", n, tt.retries)
			}
		})
	}
}

// TestRetryBudget: once retries pass the budget's share of executions, a
// failure goes to the client with x-warden-control: retry_budget.
func TestRetryBudget(t *testing.T) {
	e, addr := startEcho(t)
	f := start(t, grpcPolicy("  allow_unlisted: false", echoTarget(addr, "retry: { count: 5, logic: fixed, delay: 0s, budget: 0.1 }")))
	for range 20 { // the budget counts from 20 executions
		if _, err := f.call(context.Background(), "hi"); err != nil {
			t.Fatal(err)
		}
	}
	// 21 executions: retries while retries/executions < 0.1, each a new
	// execution too: 0/21, 1/22, 2/23 pass, 3/24 does not.
	var trailer metadata.MD
	_, err := f.call(keyed("b"), "fail:14", grpc.Trailer(&trailer))
	if status.Code(err) != codes.Unavailable || strings.Join(trailer.Get("x-warden-control"), ",") != "retry_budget" {
		t.Fatalf("%v, trailer %v", err, trailer)
	}
	if n := e.calls.Load(); n != 20+4 {
		t.Fatalf("upstream saw %d calls, want 24", n)
	}
	if n := fasttest.Value(f.gov.Metrics.Rejections.WithLabelValues("retry_budget", "echo")); n != 1 {
		t.Fatalf("rejections{retry_budget,echo} = %v", n)
	}
}

// A call whose exchange broke (nothing listening) is retried, and the
// breaker hears each attempt: three failures open it at minimum_requests 3.
func TestRetryAfterConnectionFailure(t *testing.T) {
	dead := loopback.FreeAddr(t)
	f := start(t, grpcPolicy("  allow_unlisted: false", echoTarget(dead, grpcRetry+
		"\ncircuit_breaker: { enabled: true, failure_ratio: 1, minimum_requests: 3 }")))
	var trailer metadata.MD
	_, err := f.call(keyed("c"), "hi", grpc.Trailer(&trailer))
	if status.Code(err) != codes.Unavailable || strings.Join(trailer.Get("x-warden-control"), ",") != "upstream" {
		t.Fatalf("%v, trailer %v", err, trailer)
	}
	if n := fasttest.Value(f.gov.Metrics.Retries.WithLabelValues("echo")); n != 2 {
		t.Fatalf("warden_retries_total{echo} = %v, want 2", n)
	}
	trailer = nil
	_, err = f.call(keyed("c2"), "hi", grpc.Trailer(&trailer))
	if status.Code(err) != codes.Unavailable || strings.Join(trailer.Get("x-warden-control"), ",") != "circuit_breaker" {
		t.Fatalf("after three failed attempts: %v, trailer %v", err, trailer)
	}
}

// A retried call's body goes again whole, from its start.
func TestRetryResendsTheBody(t *testing.T) {
	e, addr := startEcho(t, grpc.MaxRecvMsgSize(4<<20))
	f := start(t, grpcPolicy("  allow_unlisted: false", echoTarget(addr, grpcRetry)))
	in := "flaky:1|" + string(bytes.Repeat([]byte("0123456789"), 30000))
	out, err := f.call(keyed("d"), in)
	if err != nil || out != "echo:"+in {
		t.Fatalf("%.40q %v", out, err)
	}
	if e.calls.Load() != 2 {
		t.Fatalf("upstream saw %d calls", e.calls.Load())
	}
}

// The delay before a retry is waited on warden's clock.
func TestRetryDelayUsesClock(t *testing.T) {
	e, addr := startEcho(t)
	f := start(t, grpcPolicy("  allow_unlisted: false", echoTarget(addr,
		"retry: { count: 2, logic: exponential_backoff, delay: 10s, scale: 2, jitter: 0, budget: 1 }\ntimeout: 5m")))
	done := f.goCall(keyed("t"), "flaky:2")
	waitArmed := func(delay time.Duration, want int64) {
		t.Helper()
		fasttest.WaitArmed(t, f.clk, delay, e.calls.Load, want)
	}
	waitArmed(10*time.Second, 1)
	f.clk.Advance(10 * time.Second)
	waitArmed(20*time.Second, 2) // 20 s the second time
	f.clk.Advance(20 * time.Second)
	if err := <-done; err != nil || e.calls.Load() != 3 {
		t.Fatalf("%v after %d attempts", err, e.calls.Load())
	}
}

// startScripted serves h2c calls from steps, the nth call by the nth step
// (the last repeats), and counts the calls. A step reads the request body
// if it wants it.
func startScripted(t *testing.T, steps ...http.HandlerFunc) (string, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	calls := new(atomic.Int64)
	srv := &http.Server{Protocols: new(http.Protocols), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := int(calls.Add(1))
		steps[min(n, len(steps))-1](w, r)
	})}
	srv.Protocols.SetUnencryptedHTTP2(true)
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String(), calls
}

// answer writes a gRPC answer of msgs then status code in the trailers.
func answer(code string, msgs ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/grpc")
		w.WriteHeader(http.StatusOK)
		for _, m := range msgs {
			w.Write(append([]byte{0, 0, 0, 0, byte(len(m))}, m...))
			w.(http.Flusher).Flush()
		}
		w.Header().Set(http.TrailerPrefix+"Grpc-Status", code)
	}
}

// An HTTP error without a grpc-status is retried like a Trailers-Only
// failure; a failure after the answer began is the client's.
func TestRetriesOfOtherAnswers(t *testing.T) {
	tests := []struct {
		name  string
		steps []http.HandlerFunc
		want  codes.Code
		calls int64
	}{
		{"HTTP 503, then an answer", []http.HandlerFunc{
			func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) },
			answer("0", "ok"),
		}, codes.OK, 2},
		{"UNAVAILABLE after a message", []http.HandlerFunc{answer("14", "ok"), answer("0", "ok")}, codes.Unavailable, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr, calls := startScripted(t, tt.steps...)
			f := start(t, grpcPolicy("  allow_unlisted: false", echoTarget(addr, grpcRetry)))
			out, err := f.call(keyed("o"), "hi")
			if status.Code(err) != tt.want {
				t.Fatalf("status %v, want %v", err, tt.want)
			}
			if tt.want == codes.OK && out != "ok" {
				t.Fatalf("answer %q", out)
			}
			if n := calls.Load(); n != tt.calls {
				t.Fatalf("upstream saw %d calls, want %d", n, tt.calls)
			}
		})
	}
}

// failing answers Trailers-Only UNAVAILABLE with the headers kv.
func failing(kv ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/grpc")
		w.Header().Set("Grpc-Status", "14")
		for i := 0; i+1 < len(kv); i += 2 {
			w.Header().Set(kv[i], kv[i+1])
		}
		w.WriteHeader(http.StatusOK)
	}
}

// An upstream's grpc-retry-pushback-ms sets the delay before the retry,
// or, negative or malformed, stops the retries (gRFC A6).
func TestRetryPushback(t *testing.T) {
	addr, calls := startScripted(t, failing("Grpc-Retry-Pushback-Ms", "30000"), answer("0", "ok"))
	f := start(t, grpcPolicy("  allow_unlisted: false", echoTarget(addr,
		"retry: { count: 2, logic: fixed, delay: 1s, jitter: 0, budget: 1 }\ntimeout: 5m")))
	done := f.goCall(keyed("p"), "hi")
	fasttest.WaitArmed(t, f.clk, 30*time.Second, calls.Load, 1)
	f.clk.Advance(30 * time.Second)
	if err := <-done; err != nil || calls.Load() != 2 {
		t.Fatalf("%v after %d attempts", err, calls.Load())
	}

	// No longer than max_delay (1 h by default).
	addr, calls = startScripted(t, failing("Grpc-Retry-Pushback-Ms", "7200000"), answer("0", "ok"))
	f = start(t, grpcPolicy("  allow_unlisted: false", echoTarget(addr,
		"retry: { count: 2, logic: fixed, delay: 1s, jitter: 0, budget: 1 }\ntimeout: 5h")))
	done = f.goCall(keyed("p"), "hi")
	fasttest.WaitArmed(t, f.clk, time.Hour, calls.Load, 1)
	f.clk.Advance(time.Hour)
	if err := <-done; err != nil || calls.Load() != 2 {
		t.Fatalf("%v after %d attempts", err, calls.Load())
	}

	for _, v := range []string{"-1", "soon"} {
		addr, calls := startScripted(t, failing("Grpc-Retry-Pushback-Ms", v), answer("0", "ok"))
		f := start(t, grpcPolicy("  allow_unlisted: false", echoTarget(addr, grpcRetry)))
		if _, err := f.call(keyed("p"), "hi"); status.Code(err) != codes.Unavailable || calls.Load() != 1 {
			t.Fatalf("pushback %q: %v after %d attempts", v, err, calls.Load())
		}
	}
}

// The upstream is told what is left of the caller's deadline at each
// attempt, no later than the target's timeout; a call without a deadline
// is sent without one.
func TestDeadlinePropagated(t *testing.T) {
	tests := []struct {
		name     string
		deadline time.Duration // the caller's; 0: none
		timeout  string        // the target's
		max, min time.Duration // what the upstream may be told; max 0: nothing
	}{
		{"the target's timeout is sooner", time.Hour, "5s", 5 * time.Second, 4 * time.Second},
		{"the caller's deadline is sooner", 2 * time.Second, "5m", 2 * time.Second, time.Second},
		{"no deadline", 0, "5s", 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var mu sync.Mutex
			var told []string
			record := func(next http.HandlerFunc) http.HandlerFunc {
				return func(w http.ResponseWriter, r *http.Request) {
					mu.Lock()
					told = append(told, r.Header.Get("Grpc-Timeout"))
					mu.Unlock()
					next(w, r)
				}
			}
			addr, _ := startScripted(t, record(failing()), record(answer("0", "ok")))
			f := start(t, grpcPolicy("  allow_unlisted: false", echoTarget(addr, grpcRetry+"\ntimeout: "+tt.timeout)))
			ctx := keyed("d")
			if tt.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.deadline)
				defer cancel()
			}
			if _, err := f.call(ctx, "hi"); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(told) != 2 {
				t.Fatalf("%d attempts", len(told))
			}
			var last time.Duration
			for i, v := range told {
				if tt.max == 0 {
					if v != "" {
						t.Fatalf("attempt %d told grpc-timeout %q", i+1, v)
					}
					continue
				}
				dl, ok := callDeadline(v, t0)
				d := dl.Sub(t0)
				if !ok || d > tt.max || d < tt.min {
					t.Fatalf("attempt %d told grpc-timeout %q, want %v to %v", i+1, v, tt.min, tt.max)
				}
				if i > 0 && d > last {
					t.Fatalf("the retry was told %v, more than the first attempt's %v", d, last)
				}
				last = d
			}
		})
	}
}

func TestEncodeTimeout(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want string
	}{
		{0, "1n"},
		{-time.Second, "1n"},
		{99999999, "99999999n"},
		{100 * time.Millisecond, "100000u"},
		{100*time.Millisecond + 1, "100001u"}, // rounded up, never down
		{time.Hour, "3600000m"},
		{1000 * time.Hour, "3600000S"},
		{time.Duration(math.MaxInt64), "2562047H"}, // rounded down: 2562048H would not read back
	}
	for _, tt := range tests {
		if got := encodeTimeout(tt.d); got != tt.want {
			t.Errorf("encodeTimeout(%v) = %q, want %q", tt.d, got, tt.want)
		}
	}
}

// FuzzGrpcTimeout: any grpc-timeout value parses without a panic, and any
// duration warden writes reads back within one unit of it, and not
// shorter (but within an hour of the longest Duration).
func FuzzGrpcTimeout(f *testing.F) {
	for _, s := range []string{"1n", "50m", "99999999H", "100000000S", "-1S", "5x", "", "S"} {
		f.Add(s, int64(0))
	}
	f.Add("", int64(time.Hour))
	f.Add("", int64(math.MaxInt64))
	f.Fuzz(func(t *testing.T, header string, d int64) {
		callDeadline(header, t0)
		if d <= 0 {
			return
		}
		v := encodeTimeout(time.Duration(d))
		dl, ok := callDeadline(v, t0)
		if !ok {
			t.Fatalf("encodeTimeout(%v) = %q, which does not parse", time.Duration(d), v)
		}
		got := dl.Sub(t0)
		var unit time.Duration
		for _, u := range timeoutUnits {
			if u.unit == v[len(v)-1] {
				unit = u.d
			}
		}
		if got < time.Duration(d) && time.Duration(d) <= math.MaxInt64-unit {
			t.Fatalf("encodeTimeout(%v) = %q, read back as %v: shorter", time.Duration(d), v, got)
		}
		if got-time.Duration(d) >= unit || time.Duration(d)-got >= unit {
			t.Fatalf("encodeTimeout(%v) = %q, read back as %v", time.Duration(d), v, got)
		}
	})
}

// A client-streaming call that fails before any answer is retried with
// what the client has sent so far, and goes on with what it sends after.
func TestRetryMidStream(t *testing.T) {
	got := make(chan int, 1)
	addr, calls := startScripted(t, failing(), func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- len(b)
		answer("0", "ok")(w, r)
	})
	f := start(t, grpcPolicy("  allow_unlisted: false", echoTarget(addr, grpcRetry)))
	stream, err := f.conn.NewStream(keyed("s"), &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, "/test.v1.Echo/Chat")
	if err != nil {
		t.Fatal(err)
	}
	first := []byte("first")
	if err := stream.SendMsg(&first); err != nil {
		t.Fatal(err)
	}
	fasttest.WaitFor(t, "the retry", func() bool { return calls.Load() == 2 })
	second := []byte("second message")
	if err := stream.SendMsg(&second); err != nil {
		t.Fatal(err)
	}
	stream.CloseSend()
	var reply []byte
	if err := stream.RecvMsg(&reply); err != nil || string(reply) != "ok" {
		t.Fatalf("%q %v", reply, err)
	}
	if n, want := <-got, 5+len(first)+5+len(second); n != want {
		t.Fatalf("the retry sent %d bytes upstream, want %d (both messages)", n, want)
	}
}
