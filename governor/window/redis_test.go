package window

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/warden-dev/warden/governor/backend/redisx"
	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/metrics"
	"github.com/warden-dev/warden/internal/testkit/redistest"
	"github.com/warden-dev/warden/internal/testkit/testenv"
)

// newRedis returns a Redis counter on url under prefix, closed with the test.
func newRedis(t *testing.T, url, prefix string, clk clock.Clock, m *metrics.Metrics, tweak ...func(*RedisConfig)) *Redis {
	t.Helper()
	// Generous deadlines: exact counts must not depend on a busy machine
	// never stalling 100 ms (outages here are stopped servers, refusing
	// connections at once).
	cfg := RedisConfig{Config: redisx.Config{URL: url, DialTimeout: 5 * time.Second, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second}, Prefix: prefix}
	for _, f := range tweak {
		f(&cfg)
	}
	r, err := NewRedis(cfg, clk, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// nearNow is a fake-clock start in the real present, 10 s into a minute, so
// that Redis expiries computed from it are meaningful and a test's 60 s
// window never crosses a boundary while it runs.
func nearNow() time.Time {
	return time.Now().Truncate(time.Minute).Add(10 * time.Second)
}

// Every rule a Counter promises, run against both implementations.
func TestCounterConformance(t *testing.T) {
	url := testenv.RedisURL(t)
	impls := []struct {
		name string
		make func(t *testing.T, clk *clock.Fake) Counter
	}{
		{"memory", func(t *testing.T, clk *clock.Fake) Counter { return NewMemory(clk) }},
		{"redis", func(t *testing.T, clk *clock.Fake) Counter {
			return newRedis(t, url, redistest.Prefix(t, url), clk, nil)
		}},
	}
	k := []byte("k")
	rules := []struct {
		name string
		run  func(t *testing.T, clk *clock.Fake, c Counter, s *Scope)
	}{
		{"admits up to the limit, then refuses", func(t *testing.T, clk *clock.Fake, c Counter, s *Scope) {
			for i := 1; i <= 3; i++ {
				if d := c.Take(s, k, 3, 1, clk.Now()); !d.Allowed || d.Count != int64(i) || d.Remaining() != int64(3-i) {
					t.Fatalf("take %d: %+v", i, d)
				}
			}
			if d := c.Take(s, k, 3, 1, clk.Now()); d.Allowed || d.Count != 3 || d.Unavailable {
				t.Fatalf("take over the limit: %+v", d)
			}
		}},
		{"takes n at once", func(t *testing.T, clk *clock.Fake, c Counter, s *Scope) {
			if d := c.Take(s, k, 5, 4, clk.Now()); !d.Allowed || d.Count != 4 {
				t.Fatalf("take 4 of 5: %+v", d)
			}
			if d := c.Take(s, k, 5, 2, clk.Now()); d.Allowed || d.Count != 4 {
				t.Fatalf("take 2 more: %+v", d)
			}
		}},
		{"window bounds follow the local calendar", func(t *testing.T, clk *clock.Fake, c Counter, s *Scope) {
			d := c.Take(s, k, 3, 1, clk.Now())
			start, end := Bounds(clk.Now(), s.Window)
			if !d.Start().Equal(start) || !d.End().Equal(end) || d.ResetIn(clk.Now()) != end.Sub(clk.Now()) {
				t.Fatalf("window %v..%v, want %v..%v", d.Start(), d.End(), start, end)
			}
		}},
		{"a new window gets the full allowance", func(t *testing.T, clk *clock.Fake, c Counter, s *Scope) {
			c.Take(s, k, 1, 1, clk.Now())
			clk.Advance(time.Minute)
			if d := c.Take(s, k, 1, 1, clk.Now()); !d.Allowed || d.Count != 1 {
				t.Fatalf("next window: %+v", d)
			}
		}},
		{"refused takes are not counted", func(t *testing.T, clk *clock.Fake, c Counter, s *Scope) {
			for range 10 {
				c.Take(s, k, 2, 1, clk.Now())
			}
			if d := c.Peek(s, k, 2); d.Count != 2 || d.Allowed {
				t.Fatalf("peek after 10 takes at limit 2: %+v", d)
			}
		}},
		{"refund gives back a slot in the same window", func(t *testing.T, clk *clock.Fake, c Counter, s *Scope) {
			d := c.Take(s, k, 1, 1, clk.Now())
			if c.Take(s, k, 1, 1, clk.Now()).Allowed {
				t.Fatal("second take admitted")
			}
			c.Refund(s, k, d.Start(), 1)
			if !c.Take(s, k, 1, 1, clk.Now()).Allowed {
				t.Fatal("slot not refunded")
			}
		}},
		{"refund never credits a later window", func(t *testing.T, clk *clock.Fake, c Counter, s *Scope) {
			d := c.Take(s, k, 2, 1, clk.Now())
			clk.Advance(time.Minute)
			c.Take(s, k, 2, 2, clk.Now())
			c.Refund(s, k, d.Start(), 1)
			if c.Take(s, k, 2, 1, clk.Now()).Allowed {
				t.Fatal("refund from an old window credited the new one")
			}
		}},
		{"refund never goes below zero", func(t *testing.T, clk *clock.Fake, c Counter, s *Scope) {
			d := c.Take(s, k, 2, 1, clk.Now())
			c.Refund(s, k, d.Start(), 5)
			if d := c.Take(s, k, 2, 2, clk.Now()); !d.Allowed || d.Count != 2 {
				t.Fatalf("after an over-refund: %+v", d)
			}
		}},
		{"reset restores the allowance without moving the boundary", func(t *testing.T, clk *clock.Fake, c Counter, s *Scope) {
			before := c.Take(s, k, 1, 1, clk.Now())
			c.Reset(s, k)
			d := c.Take(s, k, 1, 1, clk.Now())
			if !d.Allowed || !d.End().Equal(before.End()) {
				t.Fatalf("after reset: %+v, want allowed in the window ending %v", d, before.End())
			}
		}},
		{"reset scope touches only that scope", func(t *testing.T, clk *clock.Fake, c Counter, s *Scope) {
			other := NewScope("other", 60)
			c.Take(s, []byte("a"), 1, 1, clk.Now())
			c.Take(s, []byte("b"), 1, 1, clk.Now())
			c.Take(other, []byte("a"), 1, 1, clk.Now())
			c.ResetScope(s)
			if !c.Take(s, []byte("a"), 1, 1, clk.Now()).Allowed || !c.Take(s, []byte("b"), 1, 1, clk.Now()).Allowed {
				t.Fatal("scope not reset")
			}
			if c.Take(other, []byte("a"), 1, 1, clk.Now()).Allowed {
				t.Fatal("other scope was reset too")
			}
		}},
		{"same key in different scopes or window sizes never collides", func(t *testing.T, clk *clock.Fake, c Counter, s *Scope) {
			c.Take(s, k, 1, 1, clk.Now())
			if !c.Take(NewScope(s.Name, 1), k, 1, 1, clk.Now()).Allowed {
				t.Fatal("1s window shared the 60s window's count")
			}
			if !c.Take(NewScope("pool:"+s.Name, 60), k, 1, 1, clk.Now()).Allowed {
				t.Fatal("scopes collided")
			}
		}},
		{"keys with separators never collide", func(t *testing.T, clk *clock.Fake, c Counter, s *Scope) {
			a, b := NewScope("rls:a:60:1", 60), NewScope("rls:a", 60)
			c.Take(a, []byte("x"), 1, 1, clk.Now())
			if !c.Take(b, []byte("60:1:x"), 1, 1, clk.Now()).Allowed {
				t.Fatal("scope rls:a:60:1 key x collided with scope rls:a key 60:1:x")
			}
		}},
		{"usage lists the live windows of the scope", func(t *testing.T, clk *clock.Fake, c Counter, s *Scope) {
			for i := range 5 {
				c.Take(s, []byte("t"+strconv.Itoa(i)), 10, int64(i+1), clk.Now())
			}
			c.Take(NewScope("other", 60), []byte("t0"), 10, 1, clk.Now())
			got := map[string]int64{}
			_, end := Bounds(clk.Now(), s.Window)
			for u := range c.Usage(s) {
				if u.Scope != s.Name || !u.End.Equal(end) {
					t.Fatalf("usage %+v", u)
				}
				got[u.Key] = u.Count
			}
			if len(got) != 5 || got["t0"] != 1 || got["t4"] != 5 {
				t.Fatalf("usage %v", got)
			}
			clk.Advance(time.Minute)
			if u := slices.Collect(c.Usage(s)); len(u) != 0 {
				t.Fatalf("usage after the window ended: %+v", u)
			}
		}},
		{"take all admits every window or none", func(t *testing.T, clk *clock.Fake, c Counter, s *Scope) {
			ws := []Want{{Scope: s, Key: []byte("a"), Limit: 2, N: 1}, {Scope: s, Key: []byte("b"), Limit: 1, N: 1}}
			out := make([]Decision, 2)
			if !c.TakeAll(ws, clk.Now(), out) || out[0].Count != 1 || out[1].Count != 1 {
				t.Fatalf("first take all: %+v", out)
			}
			if c.TakeAll(ws, clk.Now(), out) {
				t.Fatal("second take all admitted past b's limit")
			}
			if !out[0].Allowed || out[0].Count != 1 || out[1].Allowed || out[1].Count != 1 {
				t.Fatalf("refused take all: %+v", out)
			}
			if d := c.Peek(s, []byte("a"), 2); d.Count != 1 {
				t.Fatalf("a counted %d after a refused take all, want 1", d.Count)
			}
		}},
		{"a capped scope refuses a new key once its window holds the cap", func(t *testing.T, clk *clock.Fake, c Counter, s *Scope) {
			s.MaxKeys = 3
			for i := range 3 {
				if d := c.Take(s, []byte("t"+strconv.Itoa(i)), 2, 1, clk.Now()); !d.Allowed || d.Overflow {
					t.Fatalf("key %d of 3: %+v", i, d)
				}
			}
			for i := 3; i < 10; i++ {
				d := c.Take(s, []byte("t"+strconv.Itoa(i)), 2, 1, clk.Now())
				if d.Allowed || !d.Overflow || d.Count != 0 || d.Remaining() != 0 {
					t.Fatalf("key %d past the cap of 3: %+v", i, d)
				}
			}
			if d := c.Take(s, []byte("t0"), 2, 1, clk.Now()); !d.Allowed || d.Count != 2 {
				t.Fatalf("a key the window holds: %+v", d)
			}
			if d := c.Take(s, []byte("t0"), 2, 1, clk.Now()); d.Allowed || d.Overflow {
				t.Fatalf("a held key over its limit is refused for its limit, not the cap: %+v", d)
			}
			if n := len(slices.Collect(c.Usage(s))); n != 3 {
				t.Fatalf("%d keys listed, want the cap's 3", n)
			}
			clk.Advance(time.Minute)
			for i := 5; i < 8; i++ {
				if d := c.Take(s, []byte("t"+strconv.Itoa(i)), 2, 1, clk.Now()); !d.Allowed || d.Overflow {
					t.Fatalf("next window, key %d: %+v", i, d)
				}
			}
			if d := c.Take(s, []byte("t0"), 2, 1, clk.Now()); !d.Overflow {
				t.Fatalf("next window, a fourth key (held in the last one): %+v", d)
			}
		}},
		{"take all refuses a new key past the cap and counts nothing", func(t *testing.T, clk *clock.Fake, c Counter, s *Scope) {
			capped := NewScope("capped", 60)
			capped.MaxKeys = 1
			c.Take(capped, []byte("a"), 5, 1, clk.Now())
			ws := []Want{{Scope: s, Key: []byte("x"), Limit: 5, N: 1}, {Scope: capped, Key: []byte("b"), Limit: 5, N: 1}}
			out := make([]Decision, 2)
			if c.TakeAll(ws, clk.Now(), out) || !out[1].Overflow || out[1].Allowed || out[0].Overflow {
				t.Fatalf("take all with a key past the cap: %+v", out)
			}
			if d := c.Peek(s, []byte("x"), 5); d.Count != 0 {
				t.Fatalf("x counted %d by a refused take all", d.Count)
			}
			ws[1].Key = []byte("a")
			if !c.TakeAll(ws, clk.Now(), out) || out[1].Count != 2 {
				t.Fatalf("take all with the held key: %+v", out)
			}
		}},
	}
	for _, impl := range impls {
		for _, rule := range rules {
			t.Run(impl.name+"/"+rule.name, func(t *testing.T) {
				clk := clock.NewFake(nearNow())
				rule.run(t, clk, impl.make(t, clk), NewScope("pool", 60))
			})
		}
	}
}

// Three sidecars on one Redis, a window of 50 per minute, parallel load
// through all three: exactly 50 admitted in total.
func TestRedisSharedAcrossSidecars(t *testing.T) {
	url := testenv.RedisURL(t)
	prefix := redistest.Prefix(t, url)
	clk := clock.NewFake(nearNow())
	s := NewScope("pool", 60)
	var counters []*Redis
	for range 3 {
		counters = append(counters, newRedis(t, url, prefix, clk, nil))
	}
	var admitted, refused atomic.Int64
	var wg sync.WaitGroup
	for _, c := range counters {
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 25 {
					if c.Take(s, []byte("stripe"), 50, 1, clk.Now()).Allowed {
						admitted.Add(1)
					} else {
						refused.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	if admitted.Load() != 50 || refused.Load() != 3*16*25-50 {
		t.Fatalf("admitted %d, refused %d; want exactly 50 admitted", admitted.Load(), refused.Load())
	}
	rdb := redistest.Client(t, url)
	start, _ := Bounds(clk.Now(), 60)
	key := prefix + "pool:60:" + strconv.FormatInt(start.Unix(), 10) + ":stripe"
	if n, err := rdb.Get(context.Background(), key).Int64(); err != nil || n != 50 {
		t.Fatalf("GET %s = %d, %v; want 50", key, n, err)
	}
}

// The expiry is set once, when the window's key is created, at the window's
// end: later hits never move it (envoyproxy/ratelimit#72, #80, #595).
func TestRedisExpirySetOnce(t *testing.T) {
	url := testenv.RedisURL(t)
	prefix := redistest.Prefix(t, url)
	clk := clock.NewFake(time.Now())
	r := newRedis(t, url, prefix, clk, nil)
	s := NewScope("tenant:ingress", 3600)
	rdb := redistest.Client(t, url)
	ctx := context.Background()
	d := r.Take(s, []byte("acme"), 100, 1, clk.Now())
	key := prefix + "tenant%3Aingress:3600:" + strconv.FormatInt(d.Start().Unix(), 10) + ":acme"
	index := prefix + "tenant%3Aingress:3600:" + strconv.FormatInt(d.Start().Unix(), 10) + "#keys"
	expiry := func(k string) time.Duration {
		t.Helper()
		at, err := rdb.PExpireTime(ctx, k).Result() // unix time, as a duration
		if err != nil || at < 0 {
			t.Fatalf("PEXPIRETIME %s = %v, %v", k, at, err)
		}
		return at
	}
	first, firstIdx := expiry(key), expiry(index)
	// Redis measures the relative expiry from its own clock; the fake clock
	// was read just before, so the two agree within scheduling noise.
	if diff := first - time.Duration(d.End().UnixNano()); diff < -time.Second || diff > time.Second {
		t.Fatalf("key expires %v away from the window's end", diff)
	}
	pttl := rdb.PTTL(ctx, key).Val()
	for range 5 {
		clk.Advance(time.Second) // were the expiry re-set per hit, it would move by these seconds
		if !r.Take(s, []byte("acme"), 100, 1, clk.Now()).Allowed {
			t.Fatal("take refused")
		}
		r.Take(s, []byte("globex"), 100, 1, clk.Now())
	}
	if got := expiry(key); got != first {
		t.Fatalf("expiry moved from %d to %d after more hits", first, got)
	}
	if got := expiry(index); got != firstIdx {
		t.Fatalf("index expiry moved from %d to %d after more keys", firstIdx, got)
	}
	if now := rdb.PTTL(ctx, key).Val(); now > pttl {
		t.Fatalf("PTTL grew from %v to %v", pttl, now)
	}
}

// A refused take never reaches the counter: the script increments only when
// the window has room.
func TestRedisRefusedNeverIncrement(t *testing.T) {
	url := testenv.RedisURL(t)
	prefix := redistest.Prefix(t, url)
	clk := clock.NewFake(nearNow())
	noCache := func(c *RedisConfig) { c.FullRecheck = -1 }
	r := newRedis(t, url, prefix, clk, nil, noCache)
	s := NewScope("pool", 60)
	for range 10 {
		r.Take(s, []byte("k"), 3, 1, clk.Now())
	}
	r.TakeAll([]Want{{Scope: s, Key: []byte("k"), Limit: 3, N: 1}, {Scope: s, Key: []byte("other"), Limit: 3, N: 1}}, clk.Now(), make([]Decision, 2))
	rdb := redistest.Client(t, url)
	start, _ := Bounds(clk.Now(), 60)
	base := prefix + "pool:60:" + strconv.FormatInt(start.Unix(), 10) + ":"
	if n, err := rdb.Get(context.Background(), base+"k").Int64(); err != nil || n != 3 {
		t.Fatalf("GET k = %d, %v; want 3 after 10 takes at limit 3", n, err)
	}
	if err := rdb.Get(context.Background(), base+"other").Err(); err != redis.Nil {
		t.Fatalf("GET other = %v; a refused take all must not create it", err)
	}
}

// backendCalls is how many Redis calls of kind op the counter made.
func backendCalls(t *testing.T, m *metrics.Metrics, op string) uint64 {
	t.Helper()
	var pb dto.Metric
	if err := m.BackendLatency.WithLabelValues(op).(prometheus.Metric).Write(&pb); err != nil {
		t.Fatal(err)
	}
	return pb.GetHistogram().GetSampleCount()
}

func gauge(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var pb dto.Metric
	if err := g.Write(&pb); err != nil {
		t.Fatal(err)
	}
	return pb.GetGauge().GetValue()
}

// Windows Redis reported full are refused locally, without a round trip,
// until the recheck interval (or the window) ends; a local reset forgets.
func TestRedisOverLimitCache(t *testing.T) {
	url := testenv.RedisURL(t)
	clk := clock.NewFake(nearNow())
	m := metrics.New()
	r := newRedis(t, url, redistest.Prefix(t, url), clk, m)
	s := NewScope("pool", 60)
	k := []byte("k")
	r.Take(s, k, 2, 1, clk.Now())
	r.Take(s, k, 2, 1, clk.Now())
	if d := r.Take(s, k, 2, 1, clk.Now()); d.Allowed || d.Count != 2 {
		t.Fatalf("third take: %+v", d)
	}
	calls := backendCalls(t, m, "admit")
	if calls != 3 {
		t.Fatalf("%d admit calls for 3 takes", calls)
	}
	for range 100 {
		if d := r.Take(s, k, 2, 1, clk.Now()); d.Allowed || d.Count != 2 {
			t.Fatalf("cached refusal: %+v", d)
		}
	}
	if d := r.Peek(s, k, 2); d.Allowed || d.Count != 2 {
		t.Fatalf("peek of a full window: %+v", d)
	}
	if got := backendCalls(t, m, "admit") + backendCalls(t, m, "peek"); got != calls {
		t.Fatalf("%d Redis calls after 100 refusals of a full window, want %d", got, calls)
	}
	if !r.Take(s, k, 3, 1, clk.Now()).Allowed {
		t.Fatal("a raised limit was refused from the cache")
	}
	clk.Advance(DefaultFullRecheck)
	r.Take(s, k, 3, 1, clk.Now())
	if got := backendCalls(t, m, "admit"); got != calls+2 {
		t.Fatalf("%d admit calls, want %d: the cache must be rechecked after %v", got, calls+2, DefaultFullRecheck)
	}
	r.Reset(s, k)
	if !r.Take(s, k, 3, 1, clk.Now()).Allowed {
		t.Fatal("reset window refused from the cache")
	}
}

// waitBackend advances the fake clock through the probe's timer until the
// backend's state is up (or down) as wanted.
func waitBackend(t *testing.T, r *Redis, clk *clock.Fake, up bool) {
	t.Helper()
	cli := r.Client()
	deadline := time.After(20 * time.Second)
	for cli.Down() == up {
		changed, armed := cli.Changed(), clk.TimerArmed()
		if clk.Timers() == 0 {
			select {
			case <-armed:
			case <-changed:
				continue
			case <-deadline:
				t.Fatalf("backend never became up=%v", up)
			}
		}
		rearmed := clk.TimerArmed()
		clk.Advance(redisx.DefaultProbeEvery)
		select {
		case <-changed:
		case <-rearmed:
		case <-deadline:
			t.Fatalf("backend never became up=%v", up)
		}
	}
}

// Redis stopped mid-test: fail_open keeps deciding with local windows and
// says it is degraded, fail_closed refuses with the backend-down signal;
// neither pays a Redis call per decision while down, and both go back to
// Redis when it returns, without a restart.
func TestRedisOutage(t *testing.T) {
	for _, failClosed := range []bool{false, true} {
		name := map[bool]string{false: "fail_open", true: "fail_closed"}[failClosed]
		t.Run(name, func(t *testing.T) {
			srv := redistest.StartServer(t)
			clk := clock.NewFake(nearNow())
			m := metrics.New()
			r := newRedis(t, srv.URL, "", clk, m, func(c *RedisConfig) { c.FailClosed = failClosed })
			s := NewScope("pool", 60)
			k := []byte("k")
			for range 2 {
				if !r.Take(s, k, 4, 1, clk.Now()).Allowed {
					t.Fatal("take refused with Redis up")
				}
			}
			if r.Degraded() != nil || r.Ready() != nil || gauge(t, m.BackendDegraded) != 0 {
				t.Fatal("degraded with Redis up")
			}

			srv.Stop()
			// The takes that find Redis gone (at most three) are decided by
			// the fallback already.
			var got []Decision
			for !r.Client().Down() {
				if len(got) == 3 {
					t.Fatal("three failed takes did not open the breaker")
				}
				got = append(got, r.Take(s, k, 4, 1, clk.Now()))
			}
			calls := backendCalls(t, m, "admit")
			for range 6 {
				got = append(got, r.Take(s, k, 4, 1, clk.Now()))
			}
			if backendCalls(t, m, "admit") != calls {
				t.Fatal("decisions called Redis while it was known down")
			}
			if r.Degraded() == nil || gauge(t, m.BackendDegraded) != 1 {
				t.Fatal("outage not reported: Degraded() nil or warden_backend_degraded != 1")
			}
			if failClosed {
				for _, d := range got {
					if d.Allowed || !d.Unavailable {
						t.Fatalf("fail_closed decision while down: %+v", d)
					}
				}
				if r.Ready() == nil {
					t.Fatal("fail_closed: Ready() nil while refusing everything")
				}
				out := make([]Decision, 1)
				if r.TakeAll([]Want{{Scope: s, Key: k, Limit: 4, N: 1}}, clk.Now(), out) || !out[0].Unavailable {
					t.Fatalf("fail_closed take all while down: %+v", out)
				}
			} else {
				// Local windows: the first take started them, 4 fit.
				admitted := 0
				for _, d := range got {
					if d.Unavailable {
						t.Fatalf("fail_open decision marked unavailable: %+v", d)
					}
					if d.Allowed {
						admitted++
					}
				}
				if admitted != 4 {
					t.Fatalf("local windows admitted %d of %d at limit 4", admitted, len(got))
				}
				if r.Ready() != nil {
					t.Fatal("fail_open: Ready() fails; the sidecar still serves")
				}
			}

			srv.Start()
			waitBackend(t, r, clk, true)
			if r.Degraded() != nil || r.Ready() != nil || gauge(t, m.BackendDegraded) != 0 {
				t.Fatal("still degraded after recovery")
			}
			d := r.Take(s, k, 4, 1, clk.Now())
			if !d.Allowed || d.Unavailable || d.Count != 1 {
				t.Fatalf("after recovery: %+v; want the restarted (empty) Redis's count 1", d)
			}
			if backendCalls(t, m, "admit") != calls+1 {
				t.Fatal("decision after recovery did not go to Redis")
			}
		})
	}
}

// The over-limit cache is keyed by what clients send, so it is bounded:
// past fullCacheMax live entries a refusal is not remembered (Redis is
// asked again), and entries out of force make room again.
func TestFullCacheIsBounded(t *testing.T) {
	var c fullCache
	now, end, recheck := int64(10e9), int64(60e9), int64(1e9)
	for h := range uint64(3 * fullCacheMax) {
		c.mark(h+1, 7, end, now, 5, recheck)
	}
	size := func() int {
		n := 0
		for i := range c.shards {
			n += len(c.shards[i].m)
		}
		return n
	}
	if n := size(); n > fullCacheMax {
		t.Fatalf("%d entries, want at most %d", n, fullCacheMax)
	}
	if _, full := c.refused(1, end, now, 5, 1); !full {
		t.Fatal("an entry marked before the cache filled was lost")
	}
	// A recheck later every entry is out of force: new ones take their place.
	later := now + recheck
	c.mark(uint64(3*fullCacheMax)+1, 7, end, later, 5, recheck)
	if _, full := c.refused(uint64(3*fullCacheMax)+1, end, later, 5, 1); !full {
		t.Fatal("a full cache of entries out of force refused a new one")
	}
	if n := size(); n > fullCacheMax {
		t.Fatalf("%d entries after the refill, want at most %d", n, fullCacheMax)
	}
}
