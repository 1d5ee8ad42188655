package pool

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warden-dev/warden/governor/backend/redisx"
	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/control"
	"github.com/warden-dev/warden/governor/window"
	"github.com/warden-dev/warden/internal/testkit/redistest"
	"github.com/warden-dev/warden/internal/testkit/testenv"
	"github.com/warden-dev/warden/policy"
)

// sidecar is one process's view of a shared pool: its own Redis client
// (its own batcher, renewals, holder names) on the common Redis and prefix.
func sidecar(t *testing.T, url, prefix string, clk clock.Clock, failClosed bool, cfg policy.Pool) (*Pool, *window.Redis) {
	t.Helper()
	r := redisCounter(t, url, prefix, clk, failClosed)
	return NewSet([]policy.Pool{cfg}, r, clk, nil).Get(cfg.Name), r
}

// redisCounter is a Redis counter closed with the test. Generous
// deadlines: exact counts must not depend on a busy machine never
// stalling 100 ms (outages here are stopped servers, refusing at once).
func redisCounter(t *testing.T, url, prefix string, clk clock.Clock, failClosed bool) *window.Redis {
	t.Helper()
	r, err := window.NewRedis(window.RedisConfig{Config: redisx.Config{URL: url, FailClosed: failClosed,
		DialTimeout: 5 * time.Second, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second}, Prefix: prefix}, clk, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// eachBackend runs a pool test on the in-process counter and on Redis
// (shared pools: leases, unlocked admissions, their own dispatcher): the
// queue's rules must not depend on where the gates are counted.
func eachBackend(t *testing.T, run func(t *testing.T, newSet func(clk *clock.Fake, pools ...policy.Pool) *Set)) {
	t.Run("memory", func(t *testing.T) { run(t, newSet) })
	t.Run("redis", func(t *testing.T) {
		url := testenv.RedisURL(t)
		prefix := redistest.Prefix(t, url)
		run(t, func(clk *clock.Fake, pools ...policy.Pool) *Set {
			return NewSet(pools, redisCounter(t, url, prefix, clk, false), clk, nil)
		})
	})
}

// nearNow is a fake-clock start in the real present, 10 s into a minute:
// lease scores and window expiries computed from it are meaningful to
// Redis, and a test's minute never ends while it runs.
func nearNow() time.Time { return time.Now().Truncate(time.Minute).Add(10 * time.Second) }

// Three sidecars with a pool of concurrency 4, under parallel load with
// waiting: never more than 4 in flight across all three, and every caller
// is eventually admitted (slots freed on one sidecar reach waiters on the
// others).
func TestSharedConcurrencyAcrossSidecars(t *testing.T) {
	url := testenv.RedisURL(t)
	prefix := redistest.Prefix(t, url)
	cfg := policy.Pool{Name: "p", Concurrency: 4, Queue: 100, MaxWait: 30 * time.Second}
	var inFlight, peak, done atomic.Int64
	var wg sync.WaitGroup
	for range 3 {
		p, _ := sidecar(t, url, prefix, clock.Real{}, false, cfg)
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 3 {
					l, err := p.Acquire(context.Background(), 0, time.Now())
					if err != nil {
						t.Error(err)
						return
					}
					n := inFlight.Add(1)
					for old := peak.Load(); n > old && !peak.CompareAndSwap(old, n); old = peak.Load() {
					}
					time.Sleep(2 * time.Millisecond) // the work the slot is held for
					inFlight.Add(-1)
					l.Release()
					done.Add(1)
				}
			}()
		}
	}
	wg.Wait()
	if peak.Load() > 4 {
		t.Fatalf("%d in flight at once across three sidecars, want ≤ 4", peak.Load())
	}
	if done.Load() != 3*8*3 {
		t.Fatalf("%d admissions completed, want %d", done.Load(), 3*8*3)
	}
}

// A sidecar dies holding every slot (its client stops without releasing
// or renewing): the others are refused until the leases expire, then the
// slots return by themselves, with no release from the dead holder.
func TestSharedDeadHolderSlotsReturnAfterLease(t *testing.T) {
	url := testenv.RedisURL(t)
	prefix := redistest.Prefix(t, url)
	clk := clock.NewFake(nearNow())
	cfg := policy.Pool{Name: "p", Concurrency: 2, Rate: 100, Window: 60}
	dead, deadRedis := sidecar(t, url, prefix, clk, false, cfg)
	for range 2 {
		if _, _, ok := dead.TryAcquire(clk.Now()); !ok {
			t.Fatal("the first sidecar could not take its slots")
		}
	}
	deadRedis.Close() // dies: no release, no more renewals

	live, _ := sidecar(t, url, prefix, clk, false, cfg)
	if _, ctl, ok := live.TryAcquire(clk.Now()); ok || ctl != control.PoolConcurrency {
		t.Fatalf("slots of a holder inside its lease: ok=%v control=%s", ok, ctl)
	}
	clk.Advance(redisx.DefaultLeaseTTL - time.Millisecond)
	if _, _, ok := live.TryAcquire(clk.Now()); ok {
		t.Fatal("a slot returned before its lease ended")
	}
	clk.Advance(time.Millisecond)
	l, ctl, ok := live.TryAcquire(clk.Now())
	if !ok {
		t.Fatalf("the dead holder's slot did not return after its lease: %s", ctl)
	}
	if snap := live.Snapshot(clk.Now()); snap.InFlight != 1 || snap.Count != 3 {
		t.Fatalf("snapshot %+v: want 1 shared lease in flight and 3 rate slots taken", snap)
	}
	l.Release()
}

// A slot released on one sidecar reaches a waiter queued on another (by
// the retry tick: no message crosses between them).
func TestSharedWaiterGetsRemoteSlot(t *testing.T) {
	url := testenv.RedisURL(t)
	prefix := redistest.Prefix(t, url)
	cfg := policy.Pool{Name: "p", Concurrency: 1, Queue: 10, MaxWait: 20 * time.Second}
	a, _ := sidecar(t, url, prefix, clock.Real{}, false, cfg)
	b, _ := sidecar(t, url, prefix, clock.Real{}, false, cfg)
	held, err := a.Acquire(context.Background(), 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		l, err := b.Acquire(context.Background(), 0, time.Now())
		if err == nil {
			l.Release()
		}
		got <- err
	}()
	waitQueued(t, b, 1)
	select {
	case err := <-got:
		t.Fatalf("admitted while the other sidecar held the only slot: %v", err)
	default:
	}
	held.Release()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

// Redis stops under a shared pool and comes back. fail_open: this
// sidecar's own concurrency count takes over (the limit still holds
// locally); fail_closed: refusals name upstream. Both go back to the
// shared set without a restart.
func TestSharedConcurrencyOutage(t *testing.T) {
	for _, failClosed := range []bool{false, true} {
		name := map[bool]string{false: "fail_open", true: "fail_closed"}[failClosed]
		t.Run(name, func(t *testing.T) {
			srv := redistest.StartServer(t)
			p, r := sidecar(t, srv.URL, "", clock.Real{}, failClosed, policy.Pool{Name: "p", Concurrency: 1})
			l, _, ok := p.TryAcquire(time.Now())
			if !ok {
				t.Fatal("refused with Redis up")
			}
			l.Release()

			srv.Stop()
			cli := r.Client()
			for i := 0; !cli.Down(); i++ {
				if i == 3 {
					t.Fatal("three failed admissions did not open the breaker")
				}
				if l, _, ok := p.TryAcquire(time.Now()); ok {
					l.Release()
				}
			}
			l, ctl, ok := p.TryAcquire(time.Now())
			if failClosed {
				if ok || ctl != control.Upstream {
					t.Fatalf("fail_closed during the outage: ok=%v control=%s", ok, ctl)
				}
			} else {
				if !ok {
					t.Fatalf("fail_open refused on local concurrency: %s", ctl)
				}
				if _, ctl, ok := p.TryAcquire(time.Now()); ok || ctl != control.PoolConcurrency {
					t.Fatalf("local concurrency of 1 admitted a second: ok=%v control=%s", ok, ctl)
				}
				l.Release()
			}

			srv.Start()
			deadline := time.After(20 * time.Second)
			for cli.Down() {
				select {
				case <-cli.Changed():
				case <-deadline:
					t.Fatal("the backend never came back")
				}
			}
			l, ctl, ok = p.TryAcquire(time.Now())
			if !ok {
				t.Fatalf("refused after recovery: %s", ctl)
			}
			if n, ok := r.LeaseHolders(window.LeaseSet(r.Prefix(), leaseKind, p.ID()), time.Now()); !ok || n != 1 {
				t.Fatalf("after recovery the lease is not in Redis: %d %v", n, ok)
			}
			l.Release()
		})
	}
}

// holderEnv, set in a child copy of this test binary, makes it a sidecar
// that takes every slot of a shared pool, says so on stdout and then runs
// (renewing its leases) until it is killed. Its value is
// "URL PREFIX": the Redis and the key prefix to share.
const holderEnv = "WARDEN_POOL_TEST_HOLDER"

// childLeaseTTL is the short lease of the killed-holder test.
const childLeaseTTL = time.Second

// runHolder is the child's whole life.
func runHolder(spec string) {
	var url, prefix string
	if _, err := fmt.Sscan(spec, &url, &prefix); err != nil {
		fmt.Println("bad spec:", err)
		os.Exit(2)
	}
	r, err := window.NewRedis(window.RedisConfig{Config: redisx.Config{URL: url, LeaseTTL: childLeaseTTL,
		DialTimeout: 5 * time.Second, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second}, Prefix: prefix}, clock.Real{}, nil, nil)
	if err != nil {
		fmt.Println(err)
		os.Exit(2)
	}
	p := NewSet([]policy.Pool{{Name: "p", Concurrency: 2}}, r, clock.Real{}, nil).Get("p")
	for range 2 {
		if _, ctl, ok := p.TryAcquire(time.Now()); !ok {
			fmt.Println("refused:", ctl)
			os.Exit(2)
		}
	}
	fmt.Println("held")
	select {} // until SIGKILL
}

// A sidecar process holding every slot is killed with SIGKILL: while it
// lives its leases outlast their duration (it renews them), and once it
// is dead its slots return after the lease, to a waiter of another
// process, without any release.
func TestSharedKilledHolderProcess(t *testing.T) {
	url := testenv.RedisURL(t)
	prefix := redistest.Prefix(t, url)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), holderEnv+"="+url+" "+prefix)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "held\n" {
		t.Fatalf("holder process: %q %v", line, err)
	}

	p, _ := sidecar(t, url, prefix, clock.Real{}, false, policy.Pool{Name: "p", Concurrency: 2, Queue: 10, MaxWait: 20 * time.Second})
	time.Sleep(2 * childLeaseTTL) // two lease durations: only renewals keep the slots taken
	if _, ctl, ok := p.TryAcquire(time.Now()); ok || ctl != control.PoolConcurrency {
		t.Fatalf("a live holder's slots were free after its lease duration: ok=%v control=%s", ok, ctl)
	}

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	killed = true
	start := time.Now()
	l, err := p.Acquire(context.Background(), 0, start)
	if err != nil {
		t.Fatalf("the killed holder's slot never returned: %v", err)
	}
	l.Release()
	if waited := time.Since(start); waited > childLeaseTTL+5*time.Second {
		t.Fatalf("slot returned after %v, want about one lease (%v)", waited, childLeaseTTL)
	}
}

// The scheduler waits outside the pool's queue, on OnFree: a slot freed
// on another sidecar reaches it too, by the retry tick a refusal arms (no
// message crosses between sidecars).
func TestSharedOnFreeForRemoteRelease(t *testing.T) {
	url := testenv.RedisURL(t)
	prefix := redistest.Prefix(t, url)
	cfg := policy.Pool{Name: "p", Concurrency: 1}
	a, _ := sidecar(t, url, prefix, clock.Real{}, false, cfg)
	b, _ := sidecar(t, url, prefix, clock.Real{}, false, cfg)
	woken := make(chan struct{}, 1)
	b.OnFree(func() {
		select {
		case woken <- struct{}{}:
		default:
		}
	})
	held := mustTry(t, a, time.Now())
	refusedBy(t, b, time.Now(), control.PoolConcurrency) // the first sidecar holds the only slot
	held.Release()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case <-woken:
		case <-deadline:
			t.Fatal("the second sidecar was never woken after the remote release")
		}
		// Like the scheduler: try again when woken; a refusal re-arms.
		if l, _, ok := b.TryAcquire(time.Now()); ok {
			l.Release()
			return
		}
	}
}

// While an admission is on the wire to Redis, the pool's lock is free:
// another caller's bookkeeping (here: subscribing to OnFree, which takes
// only the lock) does not wait for the round trip.
func TestSharedPoolNeverLocksAcrossRedis(t *testing.T) {
	url := testenv.RedisURL(t)
	proxy := redistest.NewStallProxy(t, url)
	p, _ := sidecar(t, proxy.URL, redistest.Prefix(t, url), clock.Real{}, false, policy.Pool{Name: "p", Concurrency: 2})
	warm := mustTry(t, p, time.Now()) // connections dialled, scripts loaded
	warm.Release()
	p.Snapshot(time.Now()) // through the batcher: the release above has landed

	proxy.Stall()
	admitted := make(chan bool, 1)
	go func() {
		l, _, ok := p.TryAcquire(time.Now())
		l.Release()
		admitted <- ok
	}()
	<-proxy.Held() // the admission is on the wire, held back
	subscribed := make(chan struct{})
	go func() { p.OnFree(func() {}); close(subscribed) }()
	select {
	case <-subscribed:
	case <-time.After(3 * time.Second): // a failure bound; the admission is held until release
		t.Fatal("the pool's lock was held while its admission waited on Redis")
	}
	select {
	case <-admitted:
		t.Fatal("the admission finished while Redis was held back: the test proved nothing")
	default:
	}
	proxy.Resume()
	if !<-admitted {
		t.Fatal("admission refused after Redis answered")
	}
}

// A caller's lease gates travel in the pool's op (the scheduler's lane
// and semaphore permits): all of them and the pool's gates are taken, or
// none is — a full extra set leaves the pool's lease and rate slot
// untouched, a full pool leaves the extra sets untouched — and the extra
// leases are renewed like the pool's until released.
func TestTryAcquireWithAllOrNothing(t *testing.T) {
	url := testenv.RedisURL(t)
	prefix := redistest.Prefix(t, url)
	clk := clock.NewFake(nearNow())
	p, r := sidecar(t, url, prefix, clk, false, policy.Pool{Name: "p", Concurrency: 1, Rate: 10, Window: 60})
	rdb := redistest.Client(t, url)
	ctx := context.Background()
	setA, setB := window.LeaseSet(prefix, "test", "a"), window.LeaseSet(prefix, "test", "b")
	wants := []window.LeaseWant{{Set: setA, Limit: 1}, {Set: setB, Limit: 1}}
	holders := func(set string) int64 {
		t.Helper()
		n, ok := r.LeaseHolders(set, clk.Now())
		if !ok {
			t.Fatalf("cannot read %s", set)
		}
		return n
	}
	poolSet := window.LeaseSet(prefix, leaseKind, p.ID())

	// Set B is full (another holder, leased well into the future).
	if err := rdb.ZAdd(ctx, setB, redis.Z{Score: float64(clk.Now().Add(time.Hour).UnixMilli()), Member: "other"}).Err(); err != nil {
		t.Fatal(err)
	}
	_, ctl, ok, got := p.TryAcquireWith(wants, clk.Now())
	if ok || ctl != "" || len(got) != 2 || !got[0].OK || got[1].OK {
		t.Fatalf("with set b full: ok=%v control=%q got=%+v; want a refusal by extra gate 1 alone", ok, ctl, got)
	}
	if a, pl, snap := holders(setA), holders(poolSet), p.Snapshot(clk.Now()); a != 0 || pl != 0 || snap.Count != 0 {
		t.Fatalf("a refused admission left set a=%d, pool leases=%d, rate count=%d; want all 0", a, pl, snap.Count)
	}

	if err := rdb.ZRem(ctx, setB, "other").Err(); err != nil {
		t.Fatal(err)
	}
	l, ctl, ok, taken := p.TryAcquireWith(wants, clk.Now())
	if !ok || len(taken) != 2 || !taken[0].Lease.Shared() || !taken[1].Lease.Shared() {
		t.Fatalf("with room everywhere: ok=%v control=%q got=%+v", ok, ctl, taken)
	}
	if a, b, pl, snap := holders(setA), holders(setB), holders(poolSet), p.Snapshot(clk.Now()); a != 1 || b != 1 || pl != 1 || snap.Count != 1 {
		t.Fatalf("after the admission: a=%d b=%d pool=%d count=%d; want 1 each", a, b, pl, snap.Count)
	}
	if n := r.Client().Held(); n != 3 {
		t.Fatalf("the client renews %d leases, want 3 (pool, a, b)", n)
	}

	// The pool is full: a third set asked with it stays empty.
	setC := window.LeaseSet(prefix, "test", "c")
	_, ctl, ok, got = p.TryAcquireWith([]window.LeaseWant{{Set: setC, Limit: 5}}, clk.Now())
	if ok || ctl != control.PoolConcurrency || len(got) != 1 || !got[0].OK {
		t.Fatalf("with the pool full: ok=%v control=%q got=%+v", ok, ctl, got)
	}
	if c := holders(setC); c != 0 {
		t.Fatalf("a refused admission left %d leases in set c", c)
	}

	l.Release()
	for _, g := range taken {
		g.Lease.Release(nil)
	}
	if n := r.Client().Held(); n != 0 {
		t.Fatalf("the client still renews %d leases after their release", n)
	}
	// LeaseHolders is queued behind the releases, so it sees them.
	if a, b, pl := holders(setA), holders(setB), holders(poolSet); a != 0 || b != 0 || pl != 0 {
		t.Fatalf("after the releases: a=%d b=%d pool=%d; want 0", a, b, pl)
	}
}

// An admission that timed out on the wire may still be applied by Redis
// once the stall is over; its lease must not then hold the slot until it
// expires: the pool takes it back (redisx.Client.Revoke).
func TestTimedOutAdmissionLeavesNoLease(t *testing.T) {
	url := testenv.RedisURL(t)
	proxy := redistest.NewStallProxy(t, url)
	r, err := window.NewRedis(window.RedisConfig{Config: redisx.Config{URL: proxy.URL,
		DialTimeout: 5 * time.Second, ReadTimeout: 200 * time.Millisecond, WriteTimeout: 5 * time.Second},
		Prefix: redistest.Prefix(t, url)}, clock.Real{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	p := NewSet([]policy.Pool{{Name: "p", Concurrency: 1}}, r, clock.Real{}, nil).Get("p")
	warm := mustTry(t, p, time.Now()) // connections dialled, scripts loaded
	warm.Release()
	p.Snapshot(time.Now())

	proxy.Stall()
	done := make(chan struct{})
	go func() {
		if l, _, ok := p.TryAcquire(time.Now()); ok {
			l.Release() // the local fallback's slot, if it admitted there
		}
		close(done)
	}()
	<-proxy.Held()
	<-done // the call timed out
	proxy.Resume()
	deadline := time.Now().Add(5 * time.Second) // a failure bound: the lease itself lasts 30s
	for p.Snapshot(time.Now()).InFlight != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the timed-out admission's lease still holds the pool's slot")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if l, _, ok := p.TryAcquire(time.Now()); !ok {
		t.Fatal("the pool's only slot is still taken")
	} else {
		l.Release()
	}
}
