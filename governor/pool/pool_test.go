package pool

import (
	"context"
	"errors"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/warden-dev/warden/governor/backend/redisx"
	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/control"
	"github.com/warden-dev/warden/governor/window"
	"github.com/warden-dev/warden/policy"
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(holderEnv); spec != "" {
		runHolder(spec) // a child process of TestSharedKilledHolderProcess
	}
	goleak.VerifyTestMain(m)
}

var t0 = time.Date(2026, 1, 5, 12, 0, 17, 0, time.UTC)

func newSet(clk *clock.Fake, pools ...policy.Pool) *Set {
	return NewSet(pools, window.NewMemory(clk), clk, nil)
}

// waitQueued waits for the pool's queue to reach n: the waiters are
// goroutines the test started, so it waits on the state they produce.
func waitQueued(t *testing.T, p *Pool, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for p.Snapshot(time.Time{}).Queued != n {
		if time.Now().After(deadline) {
			t.Fatalf("queue never reached %d (at %d)", n, p.Snapshot(time.Time{}).Queued)
		}
		runtime.Gosched()
	}
}

// mustTry takes a slot without waiting, failing the test when refused.
func mustTry(t *testing.T, p *Pool, now time.Time) Lease {
	t.Helper()
	l, ctl, ok := p.TryAcquire(now)
	if !ok {
		t.Fatalf("refused by %s", ctl)
	}
	return l
}

// refusedBy fails the test unless TryAcquire is refused by control.
func refusedBy(t *testing.T, p *Pool, now time.Time, ctl control.Name) {
	t.Helper()
	if _, got, ok := p.TryAcquire(now); ok || got != ctl {
		t.Fatalf("TryAcquire: ok=%v control=%q, want refused by %s", ok, got, ctl)
	}
}

func rejection(t *testing.T, err error) *Rejection {
	t.Helper()
	var r *Rejection
	if !errors.As(err, &r) {
		t.Fatalf("error %v is not a *Rejection", err)
	}
	return r
}

func TestImmediateRefusals(t *testing.T) {
	eachBackend(t, func(t *testing.T, newSet func(clk *clock.Fake, pools ...policy.Pool) *Set) {
		tests := []struct {
			name  string
			cfg   policy.Pool
			takes int
			ctl   control.Name
		}{
			{"no queue, concurrency full", policy.Pool{Name: "p", Concurrency: 2}, 2, control.PoolQueue},
			{"no queue, rate spent", policy.Pool{Name: "p", Rate: 3, Window: 60}, 3, control.PoolQueue},
			// max_wait 0s with a queue is a wait of at most nothing:
			// refused at once by the gate that blocked, nobody queued.
			// (A cap_key of its own: the cases share one Redis prefix,
			// and the slots taken above stay held.)
			{"max_wait 0s, concurrency full", policy.Pool{Name: "p", Concurrency: 1, Queue: 5, CapKey: "zw1"}, 1, control.PoolConcurrency},
			{"max_wait 0s, rate spent", policy.Pool{Name: "p", Rate: 1, Window: 3600, Queue: 5, CapKey: "zw2"}, 1, control.PoolRate},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				clk := clock.NewFake(t0)
				p := newSet(clk, tc.cfg).Get("p")
				for i := 0; i < tc.takes; i++ {
					if _, err := p.Acquire(context.Background(), 0, clk.Now()); err != nil {
						t.Fatalf("take %d: %v", i+1, err)
					}
				}
				_, err := p.Acquire(context.Background(), 0, clk.Now())
				if r := rejection(t, err); r.Control != tc.ctl || r.Waited != 0 {
					t.Fatalf("control %s after %v, want %s at once", r.Control, r.Waited, tc.ctl)
				}
				if q := p.Snapshot(clk.Now()).Queued; q != 0 {
					t.Fatalf("%d queued", q)
				}
			})
		}
	})
}

// TestResetWithoutRate: resetting a pool that has only a concurrency
// limit (no window) is allowed and leaves its in-flight count alone, on
// both backends; with Redis it used to panic on the window's bounds, and
// ResetAll stopped at that pool.
func TestResetWithoutRate(t *testing.T) {
	eachBackend(t, func(t *testing.T, newSet func(clk *clock.Fake, pools ...policy.Pool) *Set) {
		clk := clock.NewFake(t0)
		set := newSet(clk, policy.Pool{Name: "c", Concurrency: 1}, policy.Pool{Name: "r", Rate: 1, Window: 60})
		held, err := set.Get("c").Acquire(context.Background(), 0, clk.Now())
		if err != nil {
			t.Fatal(err)
		}
		defer held.Release()
		r := set.Get("r")
		l, err := r.Acquire(context.Background(), 0, clk.Now())
		if err != nil {
			t.Fatal(err)
		}
		l.Release()
		set.ResetAll()
		if s := set.Get("c").Snapshot(clk.Now()); s.InFlight != 1 {
			t.Fatalf("concurrency-only pool after reset: %+v", s)
		}
		if s := r.Snapshot(clk.Now()); s.Count != 0 {
			t.Fatalf("the pool after the concurrency-only one was not reset: %+v", s)
		}
	})
}

func TestConcurrencyNeverExceeded(t *testing.T) {
	eachBackend(t, func(t *testing.T, newSet func(clk *clock.Fake, pools ...policy.Pool) *Set) {
		clk := clock.NewFake(t0)
		p := newSet(clk, policy.Pool{Name: "p", Concurrency: 2, Queue: 100, MaxWait: time.Hour}).Get("p")
		var inFlight, peak atomic.Int64
		var wg sync.WaitGroup
		for i := 0; i < 50; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l, err := p.Acquire(context.Background(), 0, clk.Now())
				if err != nil {
					t.Error(err)
					return
				}
				n := inFlight.Add(1)
				for {
					old := peak.Load()
					if n <= old || peak.CompareAndSwap(old, n) {
						break
					}
				}
				runtime.Gosched()
				inFlight.Add(-1)
				l.Release()
			}()
		}
		wg.Wait()
		if peak.Load() > 2 {
			t.Fatalf("peak in flight %d, want ≤ 2", peak.Load())
		}
		if s := p.Snapshot(clk.Now()); s.InFlight != 0 || s.Queued != 0 {
			t.Fatalf("left in flight %d queued %d", s.InFlight, s.Queued)
		}
	})
}

// Rate 3 per minute from 12:00:17: three start, the rest wait and are
// released at 12:01:00 (seed 002).
func TestRateWaitersReleasedAtBoundary(t *testing.T) {
	eachBackend(t, func(t *testing.T, newSet func(clk *clock.Fake, pools ...policy.Pool) *Set) {
		clk := clock.NewFake(t0)
		p := newSet(clk, policy.Pool{Name: "p", Rate: 3, Window: 60, Queue: 10, MaxWait: time.Hour}).Get("p")
		for i := 0; i < 3; i++ {
			if _, err := p.Acquire(context.Background(), 0, clk.Now()); err != nil {
				t.Fatal(err)
			}
		}
		admitted := make(chan time.Time, 5)
		var wg sync.WaitGroup
		for i := 0; i < 5; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := p.Acquire(context.Background(), 0, clk.Now()); err == nil {
					admitted <- clk.Now()
				}
			}()
		}
		waitQueued(t, p, 5)
		clk.Set(time.Date(2026, 1, 5, 12, 0, 59, 0, time.UTC))
		if len(admitted) != 0 {
			t.Fatal("waiter admitted before the boundary")
		}
		clk.Set(time.Date(2026, 1, 5, 12, 1, 0, 0, time.UTC))
		for i := 0; i < 3; i++ {
			at := <-admitted
			if at.Before(time.Date(2026, 1, 5, 12, 1, 0, 0, time.UTC)) {
				t.Fatalf("admitted at %v", at)
			}
		}
		waitQueued(t, p, 2)
		clk.Advance(time.Minute)
		wg.Wait()
		if len(admitted) != 2 {
			t.Fatalf("%d admitted in the third window, want 2", len(admitted))
		}
	})
}

func TestMaxWaitNamesTheBlockingGate(t *testing.T) {
	eachBackend(t, func(t *testing.T, newSet func(clk *clock.Fake, pools ...policy.Pool) *Set) {
		tests := []struct {
			name string
			cfg  policy.Pool
			ctl  control.Name
		}{
			{"rate", policy.Pool{Name: "p", Rate: 1, Window: 3600, Queue: 5, MaxWait: time.Second}, control.PoolRate},
			{"concurrency", policy.Pool{Name: "p", Concurrency: 1, Queue: 5, MaxWait: time.Second}, control.PoolConcurrency},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				clk := clock.NewFake(t0)
				p := newSet(clk, tc.cfg).Get("p")
				if _, err := p.Acquire(context.Background(), 0, clk.Now()); err != nil {
					t.Fatal(err)
				}
				errc := make(chan error, 1)
				go func() {
					_, err := p.Acquire(context.Background(), 0, clk.Now())
					errc <- err
				}()
				waitQueued(t, p, 1)
				clk.Advance(time.Second)
				r := rejection(t, <-errc)
				if r.Control != tc.ctl || r.Waited != time.Second {
					t.Fatalf("got %s after %v, want %s after 1s", r.Control, r.Waited, tc.ctl)
				}
			})
		}
	})
}

func TestQueueFull(t *testing.T) {
	eachBackend(t, func(t *testing.T, newSet func(clk *clock.Fake, pools ...policy.Pool) *Set) {
		clk := clock.NewFake(t0)
		p := newSet(clk, policy.Pool{Name: "p", Concurrency: 1, Queue: 1, MaxWait: time.Hour}).Get("p")
		first, _ := p.Acquire(context.Background(), 0, clk.Now())
		done := make(chan struct{})
		go func() {
			defer close(done)
			l, err := p.Acquire(context.Background(), 0, clk.Now())
			if err != nil {
				t.Error(err)
			}
			l.Release()
		}()
		waitQueued(t, p, 1)
		// Asked first (an Expect request's head), on either backend: the
		// sidecar's own queue is full.
		if r, refused := p.Refuses(clk.Now()); !refused || r.Control != control.PoolQueue {
			t.Fatalf("Refuses: %v %v, want pool_queue", r, refused)
		}
		_, err := p.Acquire(context.Background(), 0, clk.Now())
		if r := rejection(t, err); r.Control != control.PoolQueue {
			t.Fatalf("control %s, want pool_queue", r.Control)
		}
		first.Release()
		<-done
	})
}

// TestRefuses: Refuses tells, without taking anything, what Acquire would
// refuse at once, and names the same control; a request Acquire would
// admit or queue is not refused.
func TestRefuses(t *testing.T) {
	tests := []struct {
		name          string
		cfg           policy.Pool
		takes, queued int
		ctl           control.Name // "": not refused
	}{
		{"room", policy.Pool{Name: "p", Concurrency: 2, Rate: 5, Window: 60}, 1, 0, ""},
		{"no queue, concurrency full", policy.Pool{Name: "p", Concurrency: 2}, 2, 0, control.PoolQueue},
		{"no queue, rate spent", policy.Pool{Name: "p", Rate: 3, Window: 60}, 3, 0, control.PoolQueue},
		{"max_wait 0s, concurrency full", policy.Pool{Name: "p", Concurrency: 1, Queue: 5}, 1, 0, control.PoolConcurrency},
		{"max_wait 0s, rate spent", policy.Pool{Name: "p", Rate: 1, Window: 3600, Queue: 5}, 1, 0, control.PoolRate},
		{"room in the queue", policy.Pool{Name: "p", Concurrency: 1, Queue: 2, MaxWait: time.Hour}, 1, 1, ""},
		{"queue full", policy.Pool{Name: "p", Concurrency: 1, Queue: 2, MaxWait: time.Hour}, 1, 2, control.PoolQueue},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewFake(t0)
			p := newSet(clk, tc.cfg).Get("p")
			for i := range tc.takes {
				if _, err := p.Acquire(context.Background(), 0, clk.Now()); err != nil {
					t.Fatalf("take %d: %v", i+1, err)
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			for range tc.queued {
				wg.Add(1)
				go func() { defer wg.Done(); _, _ = p.Acquire(ctx, 0, clk.Now()) }()
			}
			defer func() { cancel(); wg.Wait() }()
			waitQueued(t, p, tc.queued)
			before := p.Snapshot(clk.Now())

			r, refused := p.Refuses(clk.Now())
			if got := p.Snapshot(clk.Now()); got != before {
				t.Fatalf("Refuses changed the pool: %+v, was %+v", got, before)
			}
			if tc.ctl == "" {
				if refused {
					t.Fatalf("refused by %s, want let through", r.Control)
				}
				return
			}
			if !refused || r.Control != tc.ctl || r.Pool != "p" {
				t.Fatalf("Refuses: %+v %v, want refused by %s", r, refused, tc.ctl)
			}
			_, err := p.Acquire(context.Background(), 0, clk.Now())
			if a := rejection(t, err); a.Control != r.Control || a.RetryAfter != r.RetryAfter {
				t.Fatalf("Acquire refused with %+v, Refuses said %+v", a, r)
			}
		})
	}
}

func TestPriorityThenAge(t *testing.T) {
	eachBackend(t, func(t *testing.T, newSet func(clk *clock.Fake, pools ...policy.Pool) *Set) {
		clk := clock.NewFake(t0)
		p := newSet(clk, policy.Pool{Name: "p", Concurrency: 1, Queue: 10, MaxWait: time.Hour}).Get("p")
		holder, _ := p.Acquire(context.Background(), 0, clk.Now())
		order := make(chan string, 4)
		var wg sync.WaitGroup
		enqueue := func(name string, prio, n int) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l, err := p.Acquire(context.Background(), prio, clk.Now())
				if err != nil {
					t.Error(err)
					return
				}
				order <- name
				l.Release()
			}()
			waitQueued(t, p, n)
		}
		enqueue("low-old", 0, 1)
		enqueue("high-old", 5, 2)
		enqueue("low-new", 0, 3)
		enqueue("high-new", 5, 4)
		holder.Release()
		wg.Wait()
		close(order)
		var got []string
		for s := range order {
			got = append(got, s)
		}
		want := []string{"high-old", "high-new", "low-old", "low-new"}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("order %v, want %v", got, want)
			}
		}
	})
}

func TestCancelledWaiterLeavesQueue(t *testing.T) {
	eachBackend(t, func(t *testing.T, newSet func(clk *clock.Fake, pools ...policy.Pool) *Set) {
		clk := clock.NewFake(t0)
		p := newSet(clk, policy.Pool{Name: "p", Concurrency: 1, Queue: 10, MaxWait: time.Hour}).Get("p")
		holder, _ := p.Acquire(context.Background(), 0, clk.Now())
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := p.Acquire(ctx, 0, clk.Now())
			errc <- err
		}()
		waitQueued(t, p, 1)
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("err %v, want context.Canceled", err)
		}
		holder.Release()
		if s := p.Snapshot(clk.Now()); s.InFlight != 0 || s.Queued != 0 {
			t.Fatalf("in flight %d queued %d after cancel", s.InFlight, s.Queued)
		}
	})
}

func TestCapKeySharesOnePool(t *testing.T) {
	eachBackend(t, func(t *testing.T, newSet func(clk *clock.Fake, pools ...policy.Pool) *Set) {
		clk := clock.NewFake(t0)
		s := newSet(clk,
			policy.Pool{Name: "a", Rate: 2, Window: 60, CapKey: "salesforce"},
			policy.Pool{Name: "b", Rate: 2, Window: 60, CapKey: "salesforce"},
		)
		if s.Get("a") != s.Get("b") || s.Get("a").ID() != "cap:salesforce" {
			t.Fatal("cap_key members are not one pool")
		}
		s.Get("a").Acquire(context.Background(), 0, clk.Now())
		s.Get("b").Acquire(context.Background(), 0, clk.Now())
		if _, err := s.Get("a").Acquire(context.Background(), 0, clk.Now()); err == nil {
			t.Fatal("third start across members admitted at shared rate 2")
		}
	})
}

func TestRefundResetAndReload(t *testing.T) {
	eachBackend(t, func(t *testing.T, newSet func(clk *clock.Fake, pools ...policy.Pool) *Set) {
		clk := clock.NewFake(t0)
		cfg := policy.Pool{Name: "p", Rate: 1, Window: 60, Concurrency: 5}
		s := newSet(clk, cfg)
		p := s.Get("p")

		l := mustTry(t, p, clk.Now())
		refusedBy(t, p, clk.Now(), control.PoolRate)
		l.Release()
		l.Refund()
		third, _, ok := p.TryAcquire(clk.Now())
		if !ok {
			t.Fatal("refund did not return the rate slot")
		}
		third.Release()

		p.Reset()
		snap := p.Snapshot(clk.Now())
		if snap.Count != 0 || snap.Remaining != 1 || snap.ExpiresInSeconds != 43 {
			t.Fatalf("after reset %+v, want count 0 remaining 1 expiring at the same boundary (43s)", snap)
		}

		held, _, _ := p.TryAcquire(clk.Now())
		s2 := s.Rebuild([]policy.Pool{cfg})
		if s2.Get("p") != p || s2.Get("p").Snapshot(clk.Now()).InFlight != 1 {
			t.Fatal("reload with the same pool lost its state")
		}
		held.Release()
	})
}

// Recovery after a restart has no Lease: it refunds by the persisted window
// start, and only while that window lasts.
func TestRefundAtAndResume(t *testing.T) {
	eachBackend(t, func(t *testing.T, newSet func(clk *clock.Fake, pools ...policy.Pool) *Set) {
		clk := clock.NewFake(t0)
		p := newSet(clk, policy.Pool{Name: "p", Rate: 1, Window: 60, Concurrency: 1}).Get("p")
		l, _, ok := p.TryAcquire(clk.Now())
		if !ok {
			t.Fatal("first TryAcquire refused")
		}
		start := l.WindowStart()
		l.Release()
		p.RefundAt(start.Add(-time.Minute)) // another window: no credit
		if _, ctl, ok := p.TryAcquire(clk.Now()); ok || ctl != control.PoolRate {
			t.Fatalf("refund of another window gave credit: ok=%v control=%s", ok, ctl)
		}
		p.RefundAt(start)
		again, _, ok := p.TryAcquire(clk.Now())
		if !ok {
			t.Fatal("RefundAt did not return the slot of its window")
		}
		again.Release()

		clk.Advance(43 * time.Second) // next window
		held := p.Resume()
		if snap := p.Snapshot(clk.Now()); snap.InFlight != 1 || snap.Count != 0 {
			t.Fatalf("Resume: %+v, want one in flight and no rate slot taken", snap)
		}
		if _, ctl, ok := p.TryAcquire(clk.Now()); ok || ctl != control.PoolConcurrency {
			t.Fatalf("resumed work did not hold its slot: ok=%v control=%s", ok, ctl)
		}
		held.Release()
		if _, _, ok := p.TryAcquire(clk.Now()); !ok {
			t.Fatal("released resumed slot not reusable")
		}
	})
}

// The scheduler waits outside the pool and relies on OnFree at the boundary.
func TestOnFreeAtBoundary(t *testing.T) {
	eachBackend(t, func(t *testing.T, newSet func(clk *clock.Fake, pools ...policy.Pool) *Set) {
		clk := clock.NewFake(t0)
		p := newSet(clk, policy.Pool{Name: "p", Rate: 1, Window: 60}).Get("p")
		freed := make(chan struct{}, 1)
		p.OnFree(func() {
			select {
			case freed <- struct{}{}:
			default:
			}
		})
		p.TryAcquire(clk.Now())
		p.WatchWindow()
		clk.Advance(43 * time.Second)
		<-freed
		if _, _, ok := p.TryAcquire(clk.Now()); !ok {
			t.Fatal("no room after the boundary")
		}
	})
}

func BenchmarkAcquireRelease(b *testing.B) {
	clk := clock.Real{}
	s := NewSet([]policy.Pool{{Name: "p", Concurrency: 1 << 20, Rate: 1 << 30, Window: 60}}, window.NewMemory(clk), clk, nil)
	p := s.Get("p")
	now := time.Now()
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if i&1023 == 0 {
			now = time.Now()
		}
		l, err := p.Acquire(context.Background(), 0, now)
		if err != nil {
			b.Fatal(err)
		}
		l.Release()
	}
}

// With the shared backend down and on_error fail_closed, the pool refuses
// at once with control upstream instead of queuing for a rate slot that no
// backend can grant.
func TestBackendDownFailClosedRefusesUpstream(t *testing.T) {
	clk := clock.NewFake(t0)
	// Nothing listens on port 1: the counter starts with its breaker open.
	down, err := window.NewRedis(window.RedisConfig{Config: redisx.Config{URL: "redis://127.0.0.1:1/0", FailClosed: true}}, clk, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	s := NewSet([]policy.Pool{{Name: "p", Concurrency: 2, Rate: 10, Window: 60, Queue: 10, MaxWait: time.Minute}}, down, clk, nil)
	p := s.ByID("p")
	_, err = p.Acquire(context.Background(), 0, clk.Now())
	if r := rejection(t, err); r.Control != control.Upstream || r.RetryAfter != time.Second {
		t.Fatalf("rejection %+v, want control %s", r, control.Upstream)
	}
	if _, ctl, ok := p.TryAcquire(clk.Now()); ok || ctl != control.Upstream {
		t.Fatalf("TryAcquire: ok=%v control=%q", ok, ctl)
	}
	if snap := p.Snapshot(clk.Now()); snap.InFlight != 0 || snap.Queued != 0 {
		t.Fatalf("refusals held state: %+v", snap)
	}
}
