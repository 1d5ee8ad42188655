// Package limits benchmarks the decision cost of warden's controls side by
// side with the libraries a Go user would reach for instead:
// golang.org/x/time/rate and github.com/sony/gobreaker/v2, and the shared
// (Redis) window beside envoyproxy/ratelimit's per-decision round trip.
// `make bench-limits` runs them at GOMAXPROCS 1 and 2 and prints the ratios.
//
// Every warden path is given the request's arrival time the way the data
// plane does (one clock read per request, shared by all controls), refreshed
// every 1024 operations; the baselines read their own clocks as they must.
package limits

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sony/gobreaker/v2"
	"golang.org/x/time/rate"

	"github.com/warden-dev/warden/governor/backend/redisx"
	"github.com/warden-dev/warden/governor/breaker"
	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/pool"
	"github.com/warden-dev/warden/governor/tenant"
	"github.com/warden-dev/warden/governor/window"
	"github.com/warden-dev/warden/internal/testkit/redistest"
	"github.com/warden-dev/warden/internal/testkit/testenv"
	"github.com/warden-dev/warden/policy"
)

// unlimited is a limit no benchmark reaches, and a real one: policies cap
// rates at 2^31-1, and a benchmark round never takes a billion times.
const unlimited = 1<<30 - 1

func BenchmarkWardenWindowAdmit(b *testing.B) {
	m := window.NewMemory(clock.Real{})
	s := window.NewScope("pool", 60)
	key := []byte("stripe")
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		now, i := time.Now(), 0
		for pb.Next() {
			if i&1023 == 0 {
				now = time.Now()
			}
			i++
			m.Take(s, key, unlimited, 1, now)
		}
	})
}

func BenchmarkXRateAllow(b *testing.B) {
	l := rate.NewLimiter(rate.Inf, 1)
	l.SetLimit(1e12) // a finite limit so Allow does its token arithmetic
	l.SetBurst(1 << 30)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			l.Allow()
		}
	})
}

// tenantNames writes the names of n tenants, tenant-000000 onwards, in turn
// into one small buffer. In the data plane the tenant is a header value the
// request parser just left in its read buffer, hot in the cache; the
// benchmark likewise keeps no key storage of its own to walk. 100,000
// stored keys with their slice headers are 3.7 MB, more than a core's
// second-level cache here, and walking them would evict the very counters
// the benchmark measures, on warden's side and the baseline's alike.
type tenantNames struct {
	buf  [len("tenant-000000")]byte
	i, n int
}

func newTenantNames(n, start int) *tenantNames {
	t := &tenantNames{n: n, i: start}
	t.set()
	return t
}

func (t *tenantNames) set() {
	copy(t.buf[:], "tenant-")
	v := t.i
	for j := len(t.buf) - 1; j >= len("tenant-"); j-- {
		t.buf[j] = byte('0' + v%10)
		v /= 10
	}
}

// allTenants calls f once with each of n tenants' names.
func allTenants(n int, f func(name []byte)) {
	t := newTenantNames(n, 0)
	for range n {
		f(t.name())
		t.next()
	}
}

// name is the current tenant's name; next moves to the following one.
func (t *tenantNames) name() []byte { return t.buf[:] }

func (t *tenantNames) next() {
	if t.i++; t.i == t.n {
		t.i = 0
		t.set()
		return
	}
	j := len(t.buf) - 1
	for t.buf[j] == '9' {
		t.buf[j] = '0'
		j--
	}
	t.buf[j]++
}

// tenantStart spreads the parallel callers of a tenant benchmark over the
// key space: each starts a prime stride after the last, so that two cores
// walk different tenants as two requests from a 100,000-tenant population
// almost always are, rather than the same tenants in lockstep (which would
// measure two cores fighting over each counter's cache line).
type tenantStart struct{ n atomic.Int64 }

func (s *tenantStart) next(tenants int) int { return int(s.n.Add(37_813) % int64(tenants)) }

// tenantNames must name n distinct tenants and come back to the first.
func TestTenantNames(t *testing.T) {
	const n = 1234
	names := newTenantNames(n, 1000)
	seen := map[string]bool{}
	for range n {
		k := string(names.name())
		if want := fmt.Sprintf("tenant-%06d", (1000+len(seen))%n); k != want {
			t.Fatalf("name %q, want %q", k, want)
		}
		seen[k] = true
		names.next()
	}
	if len(seen) != n || string(names.name()) != "tenant-001000" {
		t.Fatalf("%d distinct names, then %q", len(seen), names.name())
	}
}

func BenchmarkWardenTenantCheck100k(b *testing.B) {
	const n = 100_000
	caps := tenant.New("ingress", &policy.TenantCap{Header: "x-tenant-id", Rate: unlimited, Window: 60, MaxKeys: n},
		nil, window.NewMemory(clock.Real{}), nil)
	now := time.Now()
	allTenants(n, func(name []byte) { caps.Check(name, now) })
	var start tenantStart
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		now, t := time.Now(), newTenantNames(n, start.next(n))
		for i := 0; pb.Next(); i++ {
			if i&1023 == 0 {
				now = time.Now()
			}
			caps.Check(t.name(), now)
			t.next()
		}
	})
}

// A flood of tenants first seen beyond max_keys: every Check is refused a
// window of its own (a shard lock, no insert) and counted in the one
// overflow window. The cap is full of other tenants before the clock starts
// (until the minute ends: the next window counts the first of the flood
// apart, as it should).
func BenchmarkWardenTenantOverflow(b *testing.B) {
	const held, flood = 10_000, 1_000_000
	caps := tenant.New("ingress", &policy.TenantCap{Header: "x-tenant-id", Rate: unlimited, Window: 60, MaxKeys: held},
		nil, window.NewMemory(clock.Real{}), nil)
	now := time.Now()
	for i := range held {
		caps.Check([]byte("held-"+strconv.Itoa(i)), now)
	}
	if !caps.Check([]byte("tenant-000000"), now).Overflowed {
		b.Fatal("a tenant beyond max_keys was counted apart")
	}
	var start tenantStart
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		now, t := time.Now(), newTenantNames(flood, start.next(flood))
		for i := 0; pb.Next(); i++ {
			if i&1023 == 0 {
				now = time.Now()
			}
			caps.Check(t.name(), now)
			t.next()
		}
	})
}

// What a Go service does without warden: one x/time/rate limiter per tenant
// in a mutex-guarded map.
func BenchmarkXRateTenantMap100k(b *testing.B) {
	const n = 100_000
	var mu sync.Mutex
	lims := map[string]*rate.Limiter{}
	get := func(k []byte) *rate.Limiter {
		mu.Lock()
		l := lims[string(k)]
		if l == nil {
			l = rate.NewLimiter(1e12, 1<<30)
			lims[string(k)] = l
		}
		mu.Unlock()
		return l
	}
	allTenants(n, func(name []byte) { get(name) })
	var start tenantStart
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		t := newTenantNames(n, start.next(n))
		for pb.Next() {
			get(t.name()).Allow()
			t.next()
		}
	})
}

func BenchmarkWardenBreakerAllowDone(b *testing.B) {
	br := breaker.New("stripe", policy.CircuitBreaker{Enabled: true, FailureRatio: 0.5, MinimumRequests: 10,
		Window: 30 * time.Second, Open: 5 * time.Second, MaxOpen: time.Minute}, clock.Real{})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			t, _, ok := br.Allow()
			if ok {
				t.Done(breaker.Success)
			}
		}
	})
}

func BenchmarkGobreakerExecute(b *testing.B) {
	cb := gobreaker.NewCircuitBreaker[struct{}](gobreaker.Settings{
		Name:         "stripe",
		BucketPeriod: 1500 * time.Millisecond, // a 30 s rolling window in 20 buckets, like warden's
		Interval:     30 * time.Second,
		Timeout:      5 * time.Second,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			return c.Requests >= 10 && float64(c.TotalFailures)/float64(c.Requests) >= 0.5
		},
	})
	ok := func() (struct{}, error) { return struct{}{}, nil }
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_, _ = cb.Execute(ok)
		}
	})
}

// The shared path: window takes through Redis (backend.kind: redis) from
// many concurrent callers, as a busy sidecar makes them. ns/op is wall time
// per decision across all callers (1e9/ns = decisions per second). Every
// take is admitted (the limit is out of reach), so none is answered from
// the local over-limit cache.
func BenchmarkWardenRedisTake(b *testing.B) {
	r := sharedCounter(b)
	s := window.NewScope("tenant:ingress", 3600)
	var keys [][]byte // names stored, unlike the local benchmarks': a Redis round trip dwarfs walking them
	allTenants(1000, func(name []byte) { keys = append(keys, bytes.Clone(name)) })
	sharedParallel(b, func(now time.Time, i int) bool {
		return r.Take(s, keys[i%len(keys)], unlimited, 1, now).Allowed
	})
}

// What envoyproxy/ratelimit does per decision: one round trip carrying a
// pipelined INCRBY and EXPIRE, with the same callers and no batching
// across them.
func BenchmarkRedisIncrExpirePerDecision(b *testing.B) {
	url := testenv.RedisURL(b)
	prefix := redistest.Prefix(b, url)
	rdb := redistest.Client(b, url)
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = prefix + strconv.Itoa(i)
	}
	ctx := context.Background()
	b.SetParallelism(sharedCallers)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(time.Now().UnixNano() % 1000)
		for pb.Next() {
			k := keys[i%len(keys)]
			if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				p.IncrBy(ctx, k, 1)
				p.Expire(ctx, k, time.Hour)
				return nil
			}); err != nil {
				b.Error(err)
				return
			}
			i++
		}
	})
}

// sharedCallers is the concurrent callers per GOMAXPROCS of the shared
// path's benchmarks.
const sharedCallers = 64

// The shared pool path: one admission through a pool with a concurrency
// gate and a rate gate on Redis — a lease and a window take in one round
// trip of the batched admit script — and its release (a second, batched
// op), from many concurrent callers. ns/op is wall time per admission and
// release across all callers; neither gate is ever full.
func BenchmarkWardenRedisPoolAdmit(b *testing.B) {
	r := sharedCounter(b)
	p := pool.NewSet([]policy.Pool{{Name: "p", Concurrency: 1 << 30, Rate: 1 << 40, Window: 3600}}, r, clock.Real{}, nil).Get("p")
	sharedParallel(b, func(now time.Time, _ int) bool {
		l, _, ok := p.TryAcquire(now)
		l.Release()
		return ok
	})
}

// sharedCounter is a Redis counter for the shared-path benchmarks, closed
// with b. Generous deadlines: this measures throughput, and a GC pause or
// a scheduling hiccup on a shared 2-core machine must not turn into
// refusals that make the figure meaningless.
func sharedCounter(b *testing.B) *window.Redis {
	url := testenv.RedisURL(b)
	r, err := window.NewRedis(window.RedisConfig{Config: redisx.Config{URL: url, FailClosed: true,
		DialTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second},
		Prefix: redistest.Prefix(b, url)}, clock.Real{}, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { r.Close() })
	return r
}

// sharedParallel runs decide from sharedCallers goroutines per proc, with
// the arrival time refreshed every 1024 calls and a running index, and
// fails the benchmark when any decision was refused (a backend error: the
// limits are out of reach).
func sharedParallel(b *testing.B, decide func(now time.Time, i int) bool) {
	var refused atomic.Int64
	b.SetParallelism(sharedCallers)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		now, i := time.Now(), int(time.Now().UnixNano()%1000)
		for pb.Next() {
			if i&1023 == 0 {
				now = time.Now()
			}
			if !decide(now, i) {
				refused.Add(1)
			}
			i++
		}
	})
	if n := refused.Load(); n > 0 {
		b.Fatalf("%d decisions refused (backend errors): the figure would not be Redis's", n)
	}
}
