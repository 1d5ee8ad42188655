package rls

import (
	"strings"
	"testing"
	"time"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/window"
	"github.com/warden-dev/warden/policy"
)

// FuzzShouldRateLimit feeds arbitrary RateLimitRequest wire bytes to the
// decision: it must never panic, must answer one status per descriptor,
// must say OVER_LIMIT overall exactly when a descriptor is, and must never
// let a window count past its limit.
func FuzzShouldRateLimit(f *testing.F) {
	seeds := []*rlspb.RateLimitRequest{
		{Domain: "edge", Descriptors: []*commonpb.RateLimitDescriptor{desc("tenant", "acme")}},
		{Domain: "edge", HitsAddend: 4, Descriptors: []*commonpb.RateLimitDescriptor{desc("tenant", "a", "route", "/checkout"), desc("ip", "1.2.3.4")}},
		{Domain: "edge", Descriptors: []*commonpb.RateLimitDescriptor{{Entries: desc("tenant", "b").Entries, HitsAddend: wrapperspb.UInt64(1 << 40)}}},
		{Domain: "edge", Descriptors: []*commonpb.RateLimitDescriptor{{Entries: desc("tenant", "b").Entries, IsNegativeHits: true}}},
		{Domain: "other", Descriptors: []*commonpb.RateLimitDescriptor{desc("k", "v")}},
		{Domain: "edge"},
	}
	for _, s := range seeds {
		b, err := proto.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	p, err := policy.Parse("fuzz.yaml", []byte("version: 1\n"+domains))
	if err != nil {
		f.Fatal(err)
	}
	cfg := compile(p.RLS, nil, 5) // a low cap, so that fuzzing reaches the overflow windows
	f.Fuzz(func(t *testing.T, data []byte) {
		var req rlspb.RateLimitRequest
		if proto.Unmarshal(data, &req) != nil {
			return
		}
		clk := clock.NewFake(time.Date(2026, 1, 5, 12, 0, 10, 0, time.UTC))
		counter := window.NewMemory(clk)
		for range 3 {
			out, err := decide(cfg, counter, &req, clk.Now())
			if err != nil {
				if req.GetDomain() != "" && len(req.GetDescriptors()) > 0 {
					t.Fatalf("error for a well-formed request: %v", err)
				}
				return
			}
			resp := out.resp
			if len(resp.Statuses) != len(req.Descriptors) {
				t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(req.Descriptors))
			}
			over := false
			for _, st := range resp.Statuses {
				over = over || st.Code == rlspb.RateLimitResponse_OVER_LIMIT
				if l := st.CurrentLimit; l != nil && st.LimitRemaining > l.RequestsPerUnit {
					t.Fatalf("remaining %d above the limit %d", st.LimitRemaining, l.RequestsPerUnit)
				}
			}
			if over != (resp.OverallCode == rlspb.RateLimitResponse_OVER_LIMIT) || over != (out.control != "") {
				t.Fatalf("overall %v, control %q, a descriptor over: %v", resp.OverallCode, out.control, over)
			}
		}
		for _, d := range cfg.domains["edge"].keys {
			for _, l := range append([]*limit{d.def}, valuesOf(d)...) {
				if l == nil {
					continue
				}
				for u := range counter.Usage(l.scope) {
					if lim := cfg.domains["edge"].match(keyOf(l), u.Key); lim != nil && u.Count > lim.rate {
						t.Fatalf("window %s/%s counted %d past its limit %d", l.scope.Name, u.Key, u.Count, lim.rate)
					}
				}
			}
		}
	})
}

func valuesOf(k *keyLimits) []*limit {
	var out []*limit
	for _, l := range k.values {
		out = append(out, l)
	}
	return out
}

// keyOf is the descriptor key of a limit, from its scope name rls:edge:KEY
// (rls:edge:KEY= for a value's entry).
func keyOf(l *limit) string { return strings.TrimSuffix(l.scope.Name[len("rls:edge:"):], "=") }
