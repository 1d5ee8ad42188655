package tenant

import (
	"encoding/json"
	"strconv"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/warden-dev/warden/governor/backend/redisx"
	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/control"
	"github.com/warden-dev/warden/governor/metrics"
	"github.com/warden-dev/warden/governor/window"
	"github.com/warden-dev/warden/internal/testkit/redistest"
	"github.com/warden-dev/warden/internal/testkit/testenv"
	"github.com/warden-dev/warden/policy"
)

func testRedisConfig(url string) redisx.Config {
	return redisx.Config{URL: url, DialTimeout: 5 * time.Second, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second}
}

// A flood of distinct tenants against max_keys 10: the window holds ten
// tenants (and the overflow window, and the override), every later tenant
// is counted in the one overflow window at the default rate and refused
// with quota tenant_overflow once it is spent, the first ten keep their own
// windows, an override is counted apart whatever the flood, and the
// window after starts the count of tenants again.
func TestTenantFloodOverflows(t *testing.T) {
	url := testenv.RedisURL(t)
	counters := []struct {
		name string
		make func(t *testing.T, clk clock.Clock) (window.Counter, func() int)
	}{
		{"memory", func(t *testing.T, clk clock.Clock) (window.Counter, func() int) {
			m := window.NewMemory(clk)
			return m, m.Len
		}},
		{"redis", func(t *testing.T, clk clock.Clock) (window.Counter, func() int) {
			r, err := window.NewRedis(window.RedisConfig{Config: testRedisConfig(url), Prefix: redistest.Prefix(t, url)}, clk, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { r.Close() })
			return r, nil
		}},
	}
	for _, cc := range counters {
		t.Run(cc.name, func(t *testing.T) {
			// Near the real time, so that Redis's expiries (relative to
			// this clock) mean what they say, 10 s into a minute window.
			clk := clock.NewFake(time.Now().Truncate(time.Minute).Add(10 * time.Second))
			counter, held := cc.make(t, clk)
			m := metrics.New()
			caps := New("ingress", &policy.TenantCap{Header: "x-tenant-id", Rate: 3, Window: 60, MaxKeys: 10},
				map[string]policy.Limit{"acme": {Rate: 5, Window: 60}}, counter, m)
			overflowed := m.TenantOverflow.WithLabelValues("ingress")
			name := func(i int) []byte { return []byte("t" + strconv.Itoa(i)) }

			for i := range 10 {
				if r := caps.Check(name(i), clk.Now()); !r.Allowed || r.Overflowed {
					t.Fatalf("tenant %d of 10: %+v", i, r)
				}
			}
			var last Result
			admitted := 0
			for i := 10; i < 1000; i++ {
				last = caps.Check(name(i), clk.Now())
				if !last.Overflowed {
					t.Fatalf("tenant %d beyond max_keys was counted apart: %+v", i, last)
				}
				if last.Allowed {
					admitted++
				}
			}
			if admitted != 3 {
				t.Fatalf("the overflow window admitted %d, want its rate 3", admitted)
			}
			var got dto.Metric
			if err := overflowed.Write(&got); err != nil || got.GetCounter().GetValue() != 990 {
				t.Fatalf("warden_tenant_overflow_total %v (%v), want 990", got.GetCounter().GetValue(), err)
			}
			var body struct {
				Control           string
				Quota             string
				Limit             int64
				Current           int64
				RetryAfterSeconds int
			}
			if err := json.Unmarshal(refusalBody(last, clk.Now()), &body); err != nil {
				t.Fatal(err)
			}
			if body.Control != "tenant_rate" || body.Quota != "tenant_overflow" || body.Limit != 3 || body.Current != 4 || body.RetryAfterSeconds != 50 {
				t.Fatalf("overflow 429 body %+v", body)
			}
			if last.Control() != control.TenantRate || last.Remaining() != 0 {
				t.Fatalf("overflow refusal: control %q remaining %d", last.Control(), last.Remaining())
			}
			// The first ten keep their own windows: t0 has two left.
			for range 2 {
				if r := caps.Check(name(0), clk.Now()); !r.Allowed || r.Overflowed {
					t.Fatalf("tenant t0 lost its window: %+v", r)
				}
			}
			if r := caps.Check(name(0), clk.Now()); r.Allowed || r.Overflowed || r.Quota() != "tenant:t0" {
				t.Fatalf("tenant t0 past its rate: %+v", r)
			}
			// An override is the policy's, not the flood's: counted apart.
			for i := range 5 {
				if r := caps.Check([]byte("acme"), clk.Now()); !r.Allowed || r.Overflowed {
					t.Fatalf("acme request %d: %+v", i, r)
				}
			}
			if held != nil {
				if n := held(); n != 10+1+1 {
					t.Fatalf("the counter holds %d windows, want the 10 tenants, the overflow window and acme's", n)
				}
			}
			rows, _ := List([]*Caps{caps}, MaxListLimit, nil, clk.Now())
			if len(rows) != 12 {
				t.Fatalf("listed %d windows, want 12: %+v", len(rows), rows)
			}
			// Busiest first; at equal counts by tenant name ("t0" before
			// "tenant_overflow").
			if rows[0].Tenant != "acme" || rows[0].Count != 5 || rows[1].Tenant != "t0" || rows[1].Count != 3 ||
				!rows[2].Overflow || rows[2].Tenant != OverflowQuota || rows[2].Count != 3 || rows[2].Limit != 3 {
				t.Fatalf("busiest rows %+v", rows[:3])
			}

			clk.Advance(time.Minute)
			for i := 500; i < 510; i++ {
				if r := caps.Check(name(i), clk.Now()); !r.Allowed || r.Overflowed {
					t.Fatalf("next window, tenant %d: %+v", i, r)
				}
			}
			if r := caps.Check(name(0), clk.Now()); !r.Overflowed {
				t.Fatalf("next window, an eleventh tenant: %+v", r)
			}
			if held != nil {
				if n := held(); n > 10+1+1 {
					t.Fatalf("the counter holds %d windows after the next window's flood, want at most 12", n)
				}
			}
		})
	}
}
