package window

import (
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/policy"
)

var noon = time.Date(2026, 1, 5, 12, 0, 0, 0, time.UTC)

// The worked example of seed 002: rate 3 per minute, first start at 12:00:17.
func TestSeedExample(t *testing.T) {
	clk := clock.NewFake(noon.Add(17 * time.Second))
	m := NewMemory(clk)
	s := NewScope("pool", 60)
	key := []byte("salesforce")
	steps := []struct {
		at      string
		allowed bool
		count   int64
	}{
		{"12:00:17", true, 1},
		{"12:00:25", true, 2},
		{"12:00:50", true, 3},
		{"12:00:59", false, 3},
		{"12:01:00", true, 1},
	}
	for _, st := range steps {
		at, _ := time.Parse("15:04:05", st.at)
		clk.Set(time.Date(2026, 1, 5, at.Hour(), at.Minute(), at.Second(), 0, time.UTC))
		d := m.Take(s, key, 3, 1, clk.Now())
		if d.Allowed != st.allowed || d.Count != st.count {
			t.Fatalf("%s: allowed=%v count=%d, want %v %d", st.at, d.Allowed, d.Count, st.allowed, st.count)
		}
		if st.at != "12:01:00" && !d.End().Equal(noon.Add(time.Minute)) {
			t.Fatalf("%s: window ends %v, want 12:01:00", st.at, d.End())
		}
	}
}

func TestBoundaryBurstIsAtMostTwiceRate(t *testing.T) {
	clk := clock.NewFake(noon.Add(59*time.Second + 900*time.Millisecond))
	m := NewMemory(clk)
	s := NewScope("pool", 60)
	admitted := 0
	for i := 0; i < 30; i++ {
		if m.Take(s, []byte("k"), 10, 1, clk.Now()).Allowed {
			admitted++
		}
	}
	clk.Advance(200 * time.Millisecond) // across 12:01:00
	for i := 0; i < 30; i++ {
		if m.Take(s, []byte("k"), 10, 1, clk.Now()).Allowed {
			admitted++
		}
	}
	if admitted != 20 {
		t.Fatalf("admitted %d within 200ms across the boundary, want exactly 2×rate = 20", admitted)
	}
}

func TestCounterRules(t *testing.T) {
	tests := []struct {
		name string
		run  func(t *testing.T, clk *clock.Fake, m *Memory, s *Scope)
	}{
		{"created mid-window gets the full allowance", func(t *testing.T, clk *clock.Fake, m *Memory, s *Scope) {
			clk.Set(noon.Add(58 * time.Second))
			for i := 0; i < 5; i++ {
				if !m.Take(s, []byte("k"), 5, 1, clk.Now()).Allowed {
					t.Fatalf("take %d refused", i+1)
				}
			}
			if m.Take(s, []byte("k"), 5, 1, clk.Now()).Allowed {
				t.Fatal("take over rate admitted")
			}
		}},
		{"refused takes are not counted", func(t *testing.T, clk *clock.Fake, m *Memory, s *Scope) {
			for i := 0; i < 10; i++ {
				m.Take(s, []byte("k"), 2, 1, clk.Now())
			}
			if d := m.Peek(s, []byte("k"), 2); d.Count != 2 {
				t.Fatalf("count %d after 10 takes at limit 2, want 2", d.Count)
			}
		}},
		{"refund gives back a slot in the same window", func(t *testing.T, clk *clock.Fake, m *Memory, s *Scope) {
			d := m.Take(s, []byte("k"), 1, 1, clk.Now())
			m.Refund(s, []byte("k"), d.Start(), 1)
			if !m.Take(s, []byte("k"), 1, 1, clk.Now()).Allowed {
				t.Fatal("slot not refunded")
			}
		}},
		{"refund never credits a later window", func(t *testing.T, clk *clock.Fake, m *Memory, s *Scope) {
			d := m.Take(s, []byte("k"), 2, 1, clk.Now())
			clk.Advance(time.Minute)
			m.Take(s, []byte("k"), 2, 2, clk.Now())
			m.Refund(s, []byte("k"), d.Start(), 1)
			if m.Take(s, []byte("k"), 2, 1, clk.Now()).Allowed {
				t.Fatal("refund from an old window credited the new one")
			}
		}},
		{"reset restores the allowance without moving the boundary", func(t *testing.T, clk *clock.Fake, m *Memory, s *Scope) {
			clk.Set(noon.Add(34*time.Minute + 45*time.Second))
			m.Take(s, []byte("k"), 1, 1, clk.Now())
			m.Reset(s, []byte("k"))
			d := m.Take(s, []byte("k"), 1, 1, clk.Now())
			if !d.Allowed {
				t.Fatal("reset did not restore the allowance")
			}
			if want := noon.Add(35 * time.Minute); !d.End().Equal(want) {
				t.Fatalf("window ends %v after reset, want %v", d.End(), want)
			}
		}},
		{"reset scope touches only that scope", func(t *testing.T, clk *clock.Fake, m *Memory, s *Scope) {
			other := NewScope("other", 60)
			m.Take(s, []byte("a"), 1, 1, clk.Now())
			m.Take(other, []byte("a"), 1, 1, clk.Now())
			m.ResetScope(s)
			if !m.Take(s, []byte("a"), 1, 1, clk.Now()).Allowed {
				t.Fatal("scope not reset")
			}
			if m.Take(other, []byte("a"), 1, 1, clk.Now()).Allowed {
				t.Fatal("other scope was reset too")
			}
		}},
		{"same key in different scopes or window sizes never collides", func(t *testing.T, clk *clock.Fake, m *Memory, s *Scope) {
			perSecond := NewScope(s.Name, 1)
			m.Take(s, []byte("k"), 1, 1, clk.Now())
			if !m.Take(perSecond, []byte("k"), 1, 1, clk.Now()).Allowed {
				t.Fatal("1s window shared the 60s window's count")
			}
		}},
		{"expired windows are dropped", func(t *testing.T, clk *clock.Fake, m *Memory, s *Scope) {
			for i := 0; i < 100; i++ {
				m.Take(s, []byte(strconv.Itoa(i)), 1, 1, clk.Now())
			}
			if n := len(slices.Collect(m.Usage(s))); n != 100 {
				t.Fatalf("%d live windows, want 100", n)
			}
			clk.Advance(time.Minute)
			if n := len(slices.Collect(m.Usage(s))); n != 0 {
				t.Fatalf("%d live windows after expiry, want 0", n)
			}
			if dropped := m.Sweep(); dropped != 100 || m.Len() != 0 {
				t.Fatalf("sweep dropped %d, %d left", dropped, m.Len())
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewFake(noon.Add(10 * time.Second))
			tc.run(t, clk, NewMemory(clk), NewScope("pool", 60))
		})
	}
}

// The data plane reads the clock once per request (fasthttp's RequestCtx.Time)
// and hands that instant to every control, so benchmarks pass a time that
// advances like request arrivals do rather than charging time.Now to the
// decision.
func BenchmarkTake(b *testing.B) {
	m := NewMemory(clock.Real{})
	s := NewScope("pool", 60)
	key := []byte("stripe")
	now := time.Now()
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if i&1023 == 0 {
			now = time.Now()
		}
		m.Take(s, key, 1<<62, 1, now)
	}
}

func BenchmarkTakeParallel(b *testing.B) {
	m := NewMemory(clock.Real{})
	s := NewScope("pool", 60)
	keys := tenantKeys(1024)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		now := time.Now()
		i := 0
		for pb.Next() {
			if i&1023 == 0 {
				now = time.Now()
			}
			m.Take(s, keys[i&1023], 1<<62, 1, now)
			i++
		}
	})
}

func tenantKeys(n int) [][]byte {
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = []byte("tenant-" + strconv.Itoa(i))
	}
	return keys
}

func BenchmarkTake100kKeys(b *testing.B) {
	m := NewMemory(clock.Real{})
	s := NewScope("tenant", 60)
	keys := tenantKeys(100_000)
	now := time.Now()
	for _, k := range keys {
		m.Take(s, k, 1<<62, 1, now)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i&1023 == 0 {
			now = time.Now()
		}
		m.Take(s, keys[i%len(keys)], 1<<62, 1, now)
	}
}

// Requests carry the time they arrived; one stamped before a boundary may
// take the lock after one stamped after it. It must not wind the window back
// and hand out a second allowance.
func TestLateStampedTakeDoesNotRewindWindow(t *testing.T) {
	clk := clock.NewFake(noon)
	m := NewMemory(clk)
	s := NewScope("pool", 60)
	before := noon.Add(59*time.Second + 999*time.Millisecond)
	after := noon.Add(time.Minute + time.Millisecond)
	if !m.Take(s, []byte("k"), 2, 1, after).Allowed {
		t.Fatal("first take in the new window refused")
	}
	if !m.Take(s, []byte("k"), 2, 1, before).Allowed {
		t.Fatal("late-stamped take refused while the new window has room")
	}
	if m.Take(s, []byte("k"), 2, 1, after).Allowed {
		t.Fatal("third take admitted: the late-stamped one rewound the window")
	}
}

// Takes on known keys run without the shard lock while inserts grow the
// table and Sweep rebuilds it: no take may be lost or counted twice, and no
// window may pass its limit.
func TestConcurrentTakesAcrossRebuilds(t *testing.T) {
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clk := clock.NewFake(start.Add(2 * time.Second))
	m := NewMemory(clk)
	hot := NewScope("hot", policy.WindowMinute)
	cold := NewScope("cold", policy.WindowSecond)
	// Cold keys in the hot key's shard, in one-second windows already over
	// by the clock's time: each insert may grow the shard's table and each
	// sweep rebuilds it, while the hot key is being taken.
	shardOf := func(s *Scope, k []byte) uint64 { return keyHash(s, k) & (shardCount - 1) }
	var coldKeys [][]byte
	for i := 0; len(coldKeys) < 400; i++ {
		if k := []byte(strconv.Itoa(i)); shardOf(cold, k) == shardOf(hot, []byte("k")) {
			coldKeys = append(coldKeys, k)
		}
	}
	const workers, perWorker, limit = 4, 5000, 12000
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWorker {
				if m.Take(hot, []byte("k"), limit, 1, start).Allowed {
					allowed.Add(1)
				}
				if i%4 == w {
					m.Take(cold, coldKeys[(i/4)%len(coldKeys)], 1, 1, start)
				}
			}
		}()
	}
	stop := make(chan struct{})
	swept := make(chan struct{})
	go func() {
		defer close(swept)
		for {
			select {
			case <-stop:
				return
			default:
				m.Sweep()
			}
		}
	}()
	wg.Wait()
	close(stop)
	<-swept
	if got := allowed.Load(); got != limit {
		t.Fatalf("allowed %d takes of %d with limit %d, want exactly the limit", got, workers*perWorker, limit)
	}
	if d := m.Peek(hot, []byte("k"), limit); d.Count != limit {
		t.Fatalf("window holds %d, want %d", d.Count, limit)
	}
}

// A flood of distinct keys into a capped scope, window after window and
// from many goroutines, never makes the table hold more than the cap: the
// windows that ended are swept out when the cap is reached in the next.
func TestKeyCapBoundsTheTable(t *testing.T) {
	clk := clock.NewFake(noon)
	m := NewMemory(clk)
	s := NewScope("tenant:ingress", 1)
	s.MaxKeys = 50
	other := NewScope("pool", 60) // uncapped, and untouched by the flood
	m.Take(other, []byte("stripe"), 10, 1, clk.Now())
	for round := range 5 {
		var wg sync.WaitGroup
		var admitted, overflow atomic.Int64
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 1000 {
					d := m.Take(s, []byte(strconv.Itoa(round)+"-"+strconv.Itoa(g)+"-"+strconv.Itoa(i)), 1, 1, clk.Now())
					switch {
					case d.Allowed:
						admitted.Add(1)
					case d.Overflow:
						overflow.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		if admitted.Load() != 50 || overflow.Load() != 8000-50 {
			t.Fatalf("round %d: %d admitted, %d overflowed; want 50 and %d", round, admitted.Load(), overflow.Load(), 8000-50)
		}
		if n := m.Len(); n > 51 {
			t.Fatalf("round %d: the table holds %d windows, want at most the cap's 50 and the pool's", round, n)
		}
		clk.Advance(time.Second)
	}
	if d := m.Peek(other, []byte("stripe"), 10); d.Count != 1 {
		t.Fatalf("the pool's window counts %d after the sweeps, want 1", d.Count)
	}
}

// In memory, keys a Scope without a cap adds to a capped key space do not
// take the capped keys' places.
func TestUncappedTakesDoNotCountAgainstTheCap(t *testing.T) {
	clk := clock.NewFake(noon)
	m := NewMemory(clk)
	capped, open := NewScope("tenant:ingress", 60), NewScope("tenant:ingress", 60)
	capped.MaxKeys = 2
	for i := range 10 {
		if d := m.Take(open, []byte("o"+strconv.Itoa(i)), 1, 1, clk.Now()); !d.Allowed {
			t.Fatalf("uncapped key %d: %+v", i, d)
		}
	}
	for i := range 2 {
		if d := m.Take(capped, []byte("c"+strconv.Itoa(i)), 1, 1, clk.Now()); !d.Allowed {
			t.Fatalf("capped key %d: %+v", i, d)
		}
	}
	if d := m.Take(capped, []byte("c2"), 1, 1, clk.Now()); !d.Overflow {
		t.Fatalf("third capped key: %+v", d)
	}
}
