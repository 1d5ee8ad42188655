package window

import (
	"testing"
	"time"

	"github.com/warden-dev/warden/governor/backend/redisx"
	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/internal/testkit/redistest"
	"github.com/warden-dev/warden/internal/testkit/testenv"
)

// BenchmarkRedisTakeParallel is shared admissions through Redis with many
// concurrent callers (the way a busy sidecar calls): ns/op is wall time per
// admission across all callers, so 1e9/ns is admissions per second.
func BenchmarkRedisTakeParallel(b *testing.B) {
	url := testenv.RedisURL(b)
	r, err := NewRedis(RedisConfig{Config: redisx.Config{URL: url}, Prefix: redistest.Prefix(b, url)}, clock.Real{}, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	s := NewScope("tenant:ingress", 60)
	keys := tenantKeys(1024)
	b.SetParallelism(64)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		now, i := time.Now(), 0
		for pb.Next() {
			if i&1023 == 0 {
				now = time.Now()
			}
			r.Take(s, keys[i&1023], 1<<40, 1, now)
			i++
		}
	})
}
