package rls

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/warden-dev/warden/governor"
	"github.com/warden-dev/warden/governor/backend/redisx"
	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/control"
	"github.com/warden-dev/warden/governor/metrics"
	"github.com/warden-dev/warden/governor/window"
	"github.com/warden-dev/warden/internal/testkit/redistest"
	"github.com/warden-dev/warden/internal/testkit/testenv"
	"github.com/warden-dev/warden/policy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const domains = `
rls:
  listen: 127.0.0.1:0
  domains:
    edge:
      - { key: tenant, rate: 3, window: 60 }
      - { key: tenant, value: acme, rate: 5, window: 60 }
      - { key: route, value: /checkout, rate: 1, window: 1 }
      - { key: ip, rate: 100, window: 3600 }
      - { key: tenant, value: vip, rate: 0, window: 60 }
      - { key: plan, rate: 0, window: 1 }
`

// rig is one RLS on loopback with a gRPC client.
type rig struct {
	t   testing.TB
	clk *clock.Fake
	m   *metrics.Metrics
	gov *governor.Governor
	srv *Server
	cli rlspb.RateLimitServiceClient
	hc  healthpb.HealthClient
}

type counterKind string

const (
	memoryCounter counterKind = "memory"
	redisCounter  counterKind = "redis"
)

// 10 s into a minute of the real present: Redis expiries stay meaningful
// and a 60 s window does not end during a test.
func start() time.Time { return time.Now().Truncate(time.Minute).Add(10 * time.Second) }

func newRig(t testing.TB, kind counterKind, yaml string) *rig {
	t.Helper()
	clk := clock.NewFake(start())
	m := metrics.New()
	var counter window.Counter = window.NewMemory(clk)
	if kind == redisCounter {
		url := testenv.RedisURL(t)
		// Generous deadlines: exact counts must not depend on a busy
		// machine never stalling 100 ms.
		cfg := redisx.Config{URL: url, DialTimeout: 5 * time.Second, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second}
		r, err := window.NewRedis(window.RedisConfig{Config: cfg, Prefix: redistest.Prefix(t, url)}, clk, m, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		counter = r
	}
	r := &rig{t: t, clk: clk, m: m, gov: governor.New(clk, m, counter)}
	r.srv = New(counter, clk, m, nil)
	r.apply(yaml)
	t.Cleanup(func() { r.srv.Shutdown(context.Background()) })
	r.dial()
	return r
}

func (r *rig) apply(yaml string) error {
	r.t.Helper()
	p, err := policy.Parse("test.yaml", []byte("version: 1\n"+yaml))
	if err != nil {
		r.t.Fatal(err)
	}
	return r.srv.Apply(context.Background(), r.gov.Apply(p))
}

func (r *rig) dial() {
	r.t.Helper()
	conn, err := grpc.NewClient(r.srv.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { conn.Close() })
	r.cli, r.hc = rlspb.NewRateLimitServiceClient(conn), healthpb.NewHealthClient(conn)
}

// desc builds a descriptor from key, value pairs.
func desc(kv ...string) *commonpb.RateLimitDescriptor {
	d := &commonpb.RateLimitDescriptor{}
	for i := 0; i < len(kv); i += 2 {
		d.Entries = append(d.Entries, &commonpb.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func (r *rig) call(hits uint32, ds ...*commonpb.RateLimitDescriptor) *rlspb.RateLimitResponse {
	r.t.Helper()
	resp, err := r.cli.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "edge", Descriptors: ds, HitsAddend: hits})
	if err != nil {
		r.t.Fatal(err)
	}
	return resp
}

func header(resp *rlspb.RateLimitResponse, key string) string {
	for _, h := range resp.ResponseHeadersToAdd {
		if h.Key == key {
			return h.Value
		}
	}
	return ""
}

func bothCounters(t *testing.T, f func(t *testing.T, kind counterKind)) {
	for _, kind := range []counterKind{memoryCounter, redisCounter} {
		t.Run(string(kind), func(t *testing.T) { f(t, kind) })
	}
}

// OVER_LIMIT after exactly the configured count, with the window's limit,
// what remains and the exact time until the window resets.
func TestOverLimitAfterExactlyRate(t *testing.T) {
	bothCounters(t, func(t *testing.T, kind counterKind) {
		r := newRig(t, kind, domains)
		for i := 1; i <= 3; i++ {
			resp := r.call(0, desc("tenant", "globex"))
			st := resp.Statuses[0]
			if resp.OverallCode != rlspb.RateLimitResponse_OK || st.Code != rlspb.RateLimitResponse_OK || st.LimitRemaining != uint32(3-i) {
				t.Fatalf("call %d: %v", i, resp)
			}
			if st.CurrentLimit.RequestsPerUnit != 3 || st.CurrentLimit.Unit != rlspb.RateLimitResponse_RateLimit_MINUTE || st.CurrentLimit.Name != "tenant" {
				t.Fatalf("current_limit %v", st.CurrentLimit)
			}
			// The fake clock sits 10 s into its minute.
			if got := st.DurationUntilReset.AsDuration(); got != 50*time.Second {
				t.Fatalf("duration_until_reset %v, want 50s", got)
			}
		}
		r.clk.Advance(20 * time.Second)
		resp := r.call(0, desc("tenant", "globex"))
		st := resp.Statuses[0]
		if resp.OverallCode != rlspb.RateLimitResponse_OVER_LIMIT || st.Code != rlspb.RateLimitResponse_OVER_LIMIT || st.LimitRemaining != 0 {
			t.Fatalf("fourth call: %v", resp)
		}
		if got := st.DurationUntilReset.AsDuration(); got != 30*time.Second {
			t.Fatalf("duration_until_reset %v, want 30s", got)
		}
		r.clk.Advance(30 * time.Second)
		if resp := r.call(0, desc("tenant", "globex")); resp.OverallCode != rlspb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 2 {
			t.Fatalf("next window: %v", resp)
		}
	})
}

func TestMatching(t *testing.T) {
	bothCounters(t, func(t *testing.T, kind counterKind) {
		r := newRig(t, kind, domains)
		admitted := func(ds ...*commonpb.RateLimitDescriptor) int {
			n := 0
			for range 10 {
				if r.call(0, ds...).OverallCode == rlspb.RateLimitResponse_OK {
					n++
				}
			}
			return n
		}
		tests := []struct {
			name string
			ds   []*commonpb.RateLimitDescriptor
			want int
		}{
			{"a value entry overrides the key entry", []*commonpb.RateLimitDescriptor{desc("tenant", "acme")}, 5},
			{"each value has its own window", []*commonpb.RateLimitDescriptor{desc("tenant", "initech")}, 3},
			{"a value-only key limits only that value", []*commonpb.RateLimitDescriptor{desc("route", "/checkout")}, 1},
			{"other values of a value-only key are unlimited", []*commonpb.RateLimitDescriptor{desc("route", "/home")}, 10},
			{"an unknown key is unlimited", []*commonpb.RateLimitDescriptor{desc("user", "bob")}, 10},
			{"every limited entry of a descriptor counts", []*commonpb.RateLimitDescriptor{desc("tenant", "hooli", "route", "/checkout")}, 0},
			// rate: 0 turns the gate off (SPEC §4), for a value and for a key.
			{"rate 0 on a value lifts the key's limit", []*commonpb.RateLimitDescriptor{desc("tenant", "vip")}, 10},
			{"rate 0 on a key limits nothing", []*commonpb.RateLimitDescriptor{desc("plan", "free")}, 10},
		}
		for _, tc := range tests {
			if got := admitted(tc.ds...); got != tc.want {
				t.Errorf("%s: admitted %d of 10, want %d", tc.name, got, tc.want)
			}
		}
		// The /checkout window was spent above; hooli's was never counted.
		if got := admitted(desc("tenant", "hooli")); got != 3 {
			t.Errorf("hooli admitted %d of 10 after refused combined descriptors, want 3", got)
		}
		for _, d := range []*commonpb.RateLimitDescriptor{desc("user", "bob"), desc("tenant", "vip"), desc("plan", "free")} {
			resp := r.call(0, d)
			if st := resp.Statuses[0]; st.Code != rlspb.RateLimitResponse_OK || st.CurrentLimit != nil || len(resp.ResponseHeadersToAdd) != 0 {
				t.Errorf("unlimited descriptor %v: %v", d, resp)
			}
		}
	})
}

// A request is counted in all its windows or in none: one descriptor over
// its limit refuses the request and leaves the others' windows untouched.
func TestAllOrNothingAcrossDescriptors(t *testing.T) {
	bothCounters(t, func(t *testing.T, kind counterKind) {
		r := newRig(t, kind, domains)
		if resp := r.call(0, desc("route", "/checkout")); resp.OverallCode != rlspb.RateLimitResponse_OK {
			t.Fatal(resp)
		}
		for range 5 {
			resp := r.call(0, desc("tenant", "globex"), desc("route", "/checkout"))
			if resp.OverallCode != rlspb.RateLimitResponse_OVER_LIMIT ||
				resp.Statuses[0].Code != rlspb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 3 ||
				resp.Statuses[1].Code != rlspb.RateLimitResponse_OVER_LIMIT {
				t.Fatalf("combined call: %v", resp)
			}
		}
		if resp := r.call(0, desc("tenant", "globex")); resp.Statuses[0].LimitRemaining != 2 {
			t.Fatalf("globex counted while the request was refused: %v", resp)
		}
	})
}

func TestHitsAddend(t *testing.T) {
	bothCounters(t, func(t *testing.T, kind counterKind) {
		r := newRig(t, kind, domains)
		if resp := r.call(2, desc("tenant", "acme")); resp.OverallCode != rlspb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 3 {
			t.Fatalf("hits 2: %v", resp)
		}
		if resp := r.call(0, desc("tenant", "acme")); resp.Statuses[0].LimitRemaining != 2 {
			t.Fatalf("hits 0 counts as 1: %v", resp)
		}
		if resp := r.call(3, desc("tenant", "acme")); resp.OverallCode != rlspb.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("3 hits with 2 left: %v", resp)
		}
		// The descriptor's own hits_addend overrides the request's.
		d := desc("tenant", "acme")
		d.HitsAddend = wrapperspb.UInt64(2)
		if resp := r.call(3, d); resp.OverallCode != rlspb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 0 {
			t.Fatalf("descriptor hits 2: %v", resp)
		}
		// Negative hits give budget back.
		d.IsNegativeHits = true
		if resp := r.call(0, d); resp.OverallCode != rlspb.RateLimitResponse_OK {
			t.Fatalf("negative hits: %v", resp)
		}
		if resp := r.call(2, desc("tenant", "acme")); resp.OverallCode != rlspb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 0 {
			t.Fatalf("after a refund of 2: %v", resp)
		}
	})
}

// A descriptor's own hits_addend of 0 asks without counting (Envoy's
// "check only"); the request-level field's 0 still means 1.
func TestDescriptorHitsZeroChecksOnly(t *testing.T) {
	bothCounters(t, func(t *testing.T, kind counterKind) {
		r := newRig(t, kind, domains)
		check := desc("tenant", "acme")
		check.HitsAddend = wrapperspb.UInt64(0)
		for i := 0; i < 3; i++ {
			if resp := r.call(0, check); resp.OverallCode != rlspb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 5 {
				t.Fatalf("check %d on a fresh window: %v", i, resp)
			}
		}
		if resp := r.call(4, desc("tenant", "acme")); resp.Statuses[0].LimitRemaining != 1 {
			t.Fatalf("4 hits after checks: %v", resp)
		}
		if resp := r.call(0, check); resp.OverallCode != rlspb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 1 {
			t.Fatalf("check with 1 left: %v", resp)
		}
		if resp := r.call(0, desc("tenant", "acme")); resp.Statuses[0].LimitRemaining != 0 {
			t.Fatalf("the last hit: %v", resp)
		}
		if resp := r.call(0, check); resp.Statuses[0].LimitRemaining != 0 {
			t.Fatalf("check on a spent window: %v", resp)
		}
	})
}

// Descriptor values come from requests and may hold any byte: the 429
// body Envoy sends on must stay JSON.
func TestBodyIsJSONForAnyValue(t *testing.T) {
	r := newRig(t, memoryCounter, domains)
	for _, v := range []string{"a\ab", "a\x7fb", "a\U000f0000b", `q"\`} {
		for i := 0; i < 3; i++ {
			r.call(0, desc("tenant", v))
		}
		resp := r.call(0, desc("tenant", v))
		if resp.OverallCode != rlspb.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("tenant %q: 4th call at rate 3: %v", v, resp)
		}
		var body struct{ Quota string }
		if err := json.Unmarshal(resp.RawBody, &body); err != nil {
			t.Errorf("tenant %q: body %s is not JSON: %v", v, resp.RawBody, err)
		}
	}
}

// Domain, key and value are joined into one window name; a ':' or '=' in
// a domain or key must not make two limits share a count.
func TestNamesWithSeparatorsDoNotCollide(t *testing.T) {
	bothCounters(t, func(t *testing.T, kind counterKind) {
		r := newRig(t, kind, `
rls:
  listen: 127.0.0.1:0
  domains:
    x:
      - { key: "y:z", rate: 2, window: 60 }
      - { key: "k=v", rate: 2, window: 60 }
    "x:y":
      - { key: z, rate: 2, window: 60 }
      - { key: k, rate: 2, window: 60 }
`)
		call := func(domain, key, value string) *rlspb.RateLimitResponse {
			resp, err := r.cli.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: domain, Descriptors: []*commonpb.RateLimitDescriptor{desc(key, value)}})
			if err != nil {
				t.Fatal(err)
			}
			return resp
		}
		call("x", "y:z", "v")
		call("x", "y:z", "v")
		if resp := call("x:y", "z", "v"); resp.OverallCode != rlspb.RateLimitResponse_OK {
			t.Errorf("domain x:y key z counted with domain x key y:z: %v", resp)
		}
		call("x", "k=v", "w")
		call("x", "k=v", "w")
		if resp := call("x", "k", "v=w"); resp.OverallCode != rlspb.RateLimitResponse_OK {
			t.Errorf("key k value v=w counted with key k=v value w: %v", resp)
		}
	})
}

func TestResponseHeadersAndBody(t *testing.T) {
	bothCounters(t, func(t *testing.T, kind counterKind) {
		r := newRig(t, kind, domains)
		resp := r.call(0, desc("tenant", "globex"), desc("ip", "10.0.0.1"))
		want := map[string]string{control.HeaderLimit: "3", control.HeaderRemaining: "2", control.HeaderReset: "50"}
		for k, v := range want {
			if got := header(resp, k); got != v {
				t.Errorf("OK: %s = %q, want %q (the most restrictive descriptor)", k, got, v)
			}
		}
		if header(resp, control.Header) != "" || header(resp, control.HeaderRetryAfter) != "" || resp.RawBody != nil {
			t.Errorf("OK response carries refusal fields: %v", resp)
		}
		r.clk.Advance(200 * time.Millisecond)
		r.call(0, desc("tenant", "globex"))
		r.call(0, desc("tenant", "globex"))
		resp = r.call(0, desc("tenant", "globex"), desc("ip", "10.0.0.1"))
		want = map[string]string{control.HeaderLimit: "3", control.HeaderRemaining: "0", control.HeaderReset: "50", control.HeaderRetryAfter: "50", control.Header: "tenant_rate"}
		for k, v := range want {
			if got := header(resp, k); got != v {
				t.Errorf("OVER_LIMIT: %s = %q, want %q", k, got, v)
			}
		}
		if body := string(resp.RawBody); body != `{"control":"tenant_rate","quota":"rls:edge:tenant=globex","limit":3,"retryAfterSeconds":50}` {
			t.Errorf("body %s", body)
		}
	})
}

func TestRequestErrorsAndUnknownDomain(t *testing.T) {
	r := newRig(t, memoryCounter, domains)
	ctx := context.Background()
	for _, req := range []*rlspb.RateLimitRequest{
		{Descriptors: []*commonpb.RateLimitDescriptor{desc("tenant", "a")}},
		{Domain: "edge"},
	} {
		if _, err := r.cli.ShouldRateLimit(ctx, req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%v: err %v, want InvalidArgument", req, err)
		}
	}
	resp, err := r.cli.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "nope", Descriptors: []*commonpb.RateLimitDescriptor{desc("tenant", "a"), desc("x", "y")}})
	if err != nil || resp.OverallCode != rlspb.RateLimitResponse_OK || len(resp.Statuses) != 2 || resp.Statuses[1].CurrentLimit != nil {
		t.Fatalf("unknown domain: %v, %v", resp, err)
	}
	if got := counterValue(t, r.m.Requests.WithLabelValues("rls", unknownTarget, "OK")); got != 1 {
		t.Fatalf("unknown domain counted %v times under target %q", got, unknownTarget)
	}
}

// Values of a key-only entry beyond its cap share the entry's overflow
// window at the entry's rate: the window keeps the first values apart,
// values the policy names are never refused for the cap, two overflowing
// values in one request are one window, and the 429 body names the
// overflow window.
func TestValuesBeyondTheCapOverflow(t *testing.T) {
	bothCounters(t, func(t *testing.T, kind counterKind) {
		r := newRig(t, kind, domains)
		r.srv.maxKeys = 2
		if err := r.apply(domains); err != nil {
			t.Fatal(err)
		}
		for _, v := range []string{"a", "b"} {
			if resp := r.call(0, desc("tenant", v)); resp.OverallCode != rlspb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 2 {
				t.Fatalf("value %s: %v", v, resp)
			}
		}
		// c and d overflow together: one hit of the overflow window (rate 3).
		resp := r.call(0, desc("tenant", "c"), desc("tenant", "d"))
		if resp.OverallCode != rlspb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 2 || resp.Statuses[1].LimitRemaining != 2 {
			t.Fatalf("c and d: %v", resp)
		}
		for _, v := range []string{"e", "f"} {
			if resp := r.call(0, desc("tenant", v)); resp.OverallCode != rlspb.RateLimitResponse_OK {
				t.Fatalf("value %s: %v", v, resp)
			}
		}
		resp = r.call(0, desc("tenant", "g"))
		if resp.OverallCode != rlspb.RateLimitResponse_OVER_LIMIT || header(resp, control.Header) != "tenant_rate" ||
			string(resp.RawBody) != `{"control":"tenant_rate","quota":"rls_overflow:edge:tenant","limit":3,"retryAfterSeconds":50}` {
			t.Fatalf("value g past the overflow window: %v", resp)
		}
		// The values held keep their windows; acme is the policy's.
		if resp := r.call(0, desc("tenant", "a")); resp.OverallCode != rlspb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 1 {
			t.Fatalf("value a: %v", resp)
		}
		if resp := r.call(0, desc("tenant", "acme")); resp.OverallCode != rlspb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 4 {
			t.Fatalf("acme: %v", resp)
		}
		if got := counterValue(t, r.m.TenantOverflow.WithLabelValues("rls")); got != 4 {
			t.Fatalf("warden_tenant_overflow_total{rls} = %v, want 4 (c+d, e, f, g)", got)
		}
		// The next window starts the count of values again.
		r.clk.Advance(time.Minute)
		if resp := r.call(0, desc("tenant", "g")); resp.OverallCode != rlspb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 2 {
			t.Fatalf("value g in the next window: %v", resp)
		}
	})
}

func TestMetrics(t *testing.T) {
	r := newRig(t, memoryCounter, domains)
	for range 5 {
		r.call(0, desc("route", "/checkout"))
	}
	checks := []struct {
		c    prometheus.Counter
		want float64
	}{
		{r.m.Requests.WithLabelValues("rls", "edge", "OK"), 1},
		{r.m.Requests.WithLabelValues("rls", "edge", "OVER_LIMIT"), 4},
		{r.m.Rejections.WithLabelValues("tenant_rate", "rls:edge"), 4},
	}
	for _, c := range checks {
		if got := counterValue(t, c.c); got != c.want {
			t.Errorf("%v = %v, want %v", c.c.Desc(), got, c.want)
		}
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var pb dto.Metric
	if err := c.Write(&pb); err != nil {
		t.Fatal(err)
	}
	return pb.GetCounter().GetValue()
}

func TestHealthService(t *testing.T) {
	r := newRig(t, memoryCounter, domains)
	for _, svc := range []string{"", "envoy.service.ratelimit.v3.RateLimitService"} {
		resp, err := r.hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health %q: %v, %v", svc, resp, err)
		}
	}
	if err := r.srv.Ready(); err != nil {
		t.Fatal(err)
	}
}

// StopAccepting refuses new connections at once and reports NOT_SERVING,
// while a client already connected (Envoy's channel) is still answered
// until Shutdown drains it.
func TestStopAccepting(t *testing.T) {
	r := newRig(t, memoryCounter, domains)
	addr := r.srv.Addr()
	if resp := r.call(0, desc("tenant", "globex")); resp.OverallCode != rlspb.RateLimitResponse_OK {
		t.Fatalf("before: %v", resp)
	}
	r.srv.StopAccepting()
	if c, err := net.DialTimeout("tcp", addr, 5*time.Second); err == nil {
		c.Close()
		t.Fatal("the listener accepts after StopAccepting")
	}
	resp, err := r.hc.Check(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil || resp.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health after StopAccepting: %v, %v", resp, err)
	}
	if resp := r.call(0, desc("tenant", "globex")); resp.OverallCode != rlspb.RateLimitResponse_OK {
		t.Fatalf("a call on the open connection after StopAccepting: %v", resp)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}

// A reload swaps the domains in place and rebinds when rls.listen moves;
// removing the section stops the listener.
func TestReload(t *testing.T) {
	r := newRig(t, memoryCounter, domains)
	first := r.srv.Addr()
	if err := r.apply(strings.Replace(domains, "rate: 3,", "rate: 1,", 1)); err != nil {
		t.Fatal(err)
	}
	if r.srv.Addr() != first {
		t.Fatal("an unchanged listen address was rebound")
	}
	if resp := r.call(0, desc("tenant", "globex")); resp.Statuses[0].CurrentLimit.RequestsPerUnit != 1 {
		t.Fatalf("reloaded limit not in force: %v", resp)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	next := ln.Addr().String()
	ln.Close()
	if err := r.apply(strings.Replace(domains, "127.0.0.1:0", next, 1)); err != nil {
		t.Fatal(err)
	}
	if r.srv.Addr() != next {
		t.Fatalf("listening on %s, want %s", r.srv.Addr(), next)
	}
	if c, err := net.Dial("tcp", first); err == nil {
		c.Close()
		t.Fatalf("old address %s still accepts", first)
	}
	r.dial()
	if resp := r.call(0, desc("tenant", "globex")); resp.Statuses[0].LimitRemaining != 1 {
		t.Fatalf("the window did not survive the rebind: %v", resp)
	}
	// A listen address that cannot be bound keeps the running listener.
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	if err := r.apply(strings.Replace(domains, "127.0.0.1:0", busy.Addr().String(), 1)); err == nil {
		t.Fatal("binding a busy address did not fail")
	}
	if r.srv.Addr() != next {
		t.Fatal("a failed rebind dropped the running listener")
	}
	p, _ := policy.Parse("test.yaml", []byte("version: 1\n"))
	if err := r.srv.Apply(context.Background(), r.gov.Apply(p)); err != nil || r.srv.Addr() != "" {
		t.Fatalf("rls section removed: addr %q, err %v", r.srv.Addr(), err)
	}
}

// With the backend down and on_error fail_closed, every limited request is
// refused with control upstream.
func TestBackendDownFailClosed(t *testing.T) {
	clk := clock.NewFake(start())
	m := metrics.New()
	down, err := window.NewRedis(window.RedisConfig{Config: redisx.Config{URL: "redis://127.0.0.1:1/0", FailClosed: true}}, clk, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	r := &rig{t: t, clk: clk, m: m, gov: governor.New(clk, m, down)}
	r.srv = New(down, clk, m, nil)
	r.apply(domains)
	defer r.srv.Shutdown(context.Background())
	r.dial()
	resp := r.call(0, desc("tenant", "globex"))
	if resp.OverallCode != rlspb.RateLimitResponse_OVER_LIMIT || header(resp, control.Header) != "upstream" || header(resp, control.HeaderRetryAfter) != "1" {
		t.Fatalf("fail_closed outage: %v", resp)
	}
	for _, k := range []string{control.HeaderLimit, control.HeaderRemaining, control.HeaderReset} {
		if v := header(resp, k); v != "" {
			t.Errorf("fail_closed outage sets %s: %s, though nothing was counted", k, v)
		}
	}
	if got := counterValue(t, m.Rejections.WithLabelValues("upstream", "rls:edge")); got != 1 {
		t.Fatalf("upstream rejections %v", got)
	}
	if resp := r.call(0, desc("user", "bob")); resp.OverallCode != rlspb.RateLimitResponse_OK {
		t.Fatalf("an unlimited descriptor was refused: %v", resp)
	}
}
