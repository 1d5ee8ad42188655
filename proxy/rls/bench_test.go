package rls

import (
	"context"
	"strconv"
	"testing"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

const benchDomains = `
rls:
  listen: 127.0.0.1:0
  domains:
    edge:
      - { key: tenant, rate: 2000000000, window: 3600 }
`

// BenchmarkShouldRateLimit is whole gRPC calls over loopback from 32
// callers per GOMAXPROCS on one connection: ns/op is wall time per call,
// client and server on the same cores.
func BenchmarkShouldRateLimit(b *testing.B) {
	for _, kind := range []counterKind{memoryCounter, redisCounter} {
		b.Run(string(kind), func(b *testing.B) {
			r := newRig(b, kind, benchDomains)
			reqs := make([]*rlspb.RateLimitRequest, 1000)
			for i := range reqs {
				reqs[i] = &rlspb.RateLimitRequest{Domain: "edge", Descriptors: []*commonpb.RateLimitDescriptor{desc("tenant", "t"+strconv.Itoa(i))}}
			}
			b.SetParallelism(32)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					resp, err := r.cli.ShouldRateLimit(context.Background(), reqs[i%len(reqs)])
					if err != nil || resp.OverallCode != rlspb.RateLimitResponse_OK {
						b.Errorf("%v %v", resp, err)
						return
					}
					i++
				}
			})
		})
	}
}
