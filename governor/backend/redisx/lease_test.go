package redisx

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/internal/testkit/redistest"
	"github.com/warden-dev/warden/internal/testkit/testenv"
)

func openAt(t *testing.T, url string, clk clock.Clock, ttl time.Duration) *Client {
	t.Helper()
	c, err := Open(Config{URL: url, LeaseTTL: ttl, DialTimeout: 5 * time.Second, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second}, clk, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// admitLease runs one op of a lease gate on set (limit holders), then
// optionally a window gate, and reports the lease's value and whether the
// op was admitted.
func admitLease(t *testing.T, c *Client, set, holder string, limit int64, now time.Time, window string, wlimit int64) (int64, bool) {
	t.Helper()
	op := GetOp()
	defer PutOp(op)
	op.AddLease(set, holder, limit, now, c.LeaseTTL())
	if window != "" {
		op.AddWindow(window, window+"#idx", "k", wlimit, 1, 0, time.Minute)
	}
	if err := c.Admit(op); err != nil {
		t.Fatal(err)
	}
	v, _ := op.Result(0)
	return v, op.Admitted()
}

// The lease gate, step by step: it admits up to its limit, refuses without
// adding, takes a window and a lease together or neither, sweeps expired
// leases, renews held ones and releases idempotently.
func TestLeaseGate(t *testing.T) {
	url := testenv.RedisURL(t)
	rdb := redistest.Client(t, url)
	ctx := context.Background()
	const ttl = 30 * time.Second
	t0 := time.Now().Truncate(time.Second)

	steps := []struct {
		name string
		run  func(t *testing.T, c *Client, clk *clock.Fake, set, win string)
	}{
		{"admits up to the limit, then refuses without adding", func(t *testing.T, c *Client, clk *clock.Fake, set, win string) {
			for i := int64(1); i <= 3; i++ {
				if v, ok := admitLease(t, c, set, c.NewHolder(), 3, clk.Now(), "", 0); !ok || v != i {
					t.Fatalf("take %d: ok=%v holders=%d", i, ok, v)
				}
			}
			if v, ok := admitLease(t, c, set, "late", 3, clk.Now(), "", 0); ok || v != 3 {
				t.Fatalf("fourth take: ok=%v holders=%d", ok, v)
			}
			if rdb.ZCard(ctx, set).Val() != 3 || rdb.ZScore(ctx, set, "late").Err() == nil {
				t.Fatal("a refused lease was added")
			}
			if ttl := rdb.PTTL(ctx, set).Val(); ttl <= 25*time.Second || ttl > 30*time.Second {
				t.Fatalf("set PTTL %v, want the lease's 30s", ttl)
			}
		}},
		{"a full window refuses the lease too", func(t *testing.T, c *Client, clk *clock.Fake, set, win string) {
			rdb.Set(ctx, win, 5, time.Minute)
			if _, ok := admitLease(t, c, set, "a", 3, clk.Now(), win, 5); ok {
				t.Fatal("admitted with the window full")
			}
			if rdb.Exists(ctx, set).Val() != 0 && rdb.ZCard(ctx, set).Val() != 0 {
				t.Fatal("the lease was kept although the window refused")
			}
			if rdb.Get(ctx, win).Val() != "5" {
				t.Fatal("the window changed")
			}
		}},
		{"a full lease set refuses the window too", func(t *testing.T, c *Client, clk *clock.Fake, set, win string) {
			admitLease(t, c, set, "a", 1, clk.Now(), "", 0)
			if _, ok := admitLease(t, c, set, "b", 1, clk.Now(), win, 5); ok {
				t.Fatal("admitted with the lease set full")
			}
			if rdb.Exists(ctx, win).Val() != 0 {
				t.Fatal("the window was counted although the lease refused")
			}
		}},
		{"both admit: both are taken", func(t *testing.T, c *Client, clk *clock.Fake, set, win string) {
			if v, ok := admitLease(t, c, set, "a", 2, clk.Now(), win, 5); !ok || v != 1 {
				t.Fatalf("ok=%v holders=%d", ok, v)
			}
			if rdb.Get(ctx, win).Val() != "1" || rdb.ZCard(ctx, set).Val() != 1 {
				t.Fatal("not both taken")
			}
		}},
		{"an expired lease is swept and its slot returns", func(t *testing.T, c *Client, clk *clock.Fake, set, win string) {
			admitLease(t, c, set, "dead", 1, clk.Now(), "", 0)
			clk.Advance(ttl - time.Millisecond)
			if _, ok := admitLease(t, c, set, "b", 1, clk.Now(), "", 0); ok {
				t.Fatal("admitted before the lease expired")
			}
			clk.Advance(time.Millisecond)
			if v, ok := admitLease(t, c, set, "b", 1, clk.Now(), "", 0); !ok || v != 1 {
				t.Fatalf("after expiry: ok=%v holders=%d", ok, v)
			}
			if rdb.ZScore(ctx, set, "dead").Err() == nil {
				t.Fatal("the expired holder is still in the set")
			}
		}},
		{"a renewed lease outlives its first expiry; one Redis lost is added back while held, even past the limit", func(t *testing.T, c *Client, clk *clock.Fake, set, win string) {
			h := c.NewHolder()
			admitLease(t, c, set, h, 1, clk.Now(), "", 0)
			c.Hold(set, h)
			// set+"x" is full with another holder, and Redis lost this
			// client's lease there (a restart, say): it still runs.
			rdb.ZAdd(ctx, set+"x", redisZ(clk.Now().Add(ttl), "other"))
			c.Hold(set+"x", "lost")
			// A lease released before the renewal stays released.
			c.Hold(set+"x", "released")
			c.Release(set+"x", "released", nil)
			clk.Advance(ttl / 2)
			c.RenewNow()
			clk.Advance(ttl/2 + time.Second)
			if _, ok := admitLease(t, c, set, "b", 1, clk.Now(), "", 0); ok {
				t.Fatal("a renewed lease expired at its first expiry")
			}
			score, err := rdb.ZScore(ctx, set+"x", "lost").Result()
			if err != nil {
				t.Fatalf("the lost lease of a live holder was not added back: %v", err)
			}
			if expiry := time.UnixMilli(int64(score)); !expiry.After(clk.Now()) {
				t.Fatalf("re-added lease expires at %v, before now (%v): it is not renewed", expiry, clk.Now())
			}
			if rdb.ZScore(ctx, set+"x", "released").Err() == nil {
				t.Fatal("renewal added back a lease its holder had released")
			}
			rdb.Del(ctx, set+"x")
			c.Release(set, h, nil)
			c.Release(set+"x", "lost", nil)
		}},
		{"release removes the holder once; twice is harmless", func(t *testing.T, c *Client, clk *clock.Fake, set, win string) {
			h := c.NewHolder()
			admitLease(t, c, set, h, 1, clk.Now(), "", 0)
			c.Hold(set, h)
			for range 2 {
				done := make(chan struct{})
				c.Release(set, h, func() { close(done) })
				<-done
				if rdb.ZCard(ctx, set).Val() != 0 {
					t.Fatal("release left the holder")
				}
			}
			if c.Held() != 0 {
				t.Fatalf("still renewing %d leases", c.Held())
			}
			if _, ok := admitLease(t, c, set, "b", 1, clk.Now(), "", 0); !ok {
				t.Fatal("slot not back after release")
			}
		}},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			clk := clock.NewFake(t0)
			c := openAt(t, url, clk, ttl)
			prefix := redistest.Prefix(t, url)
			st.run(t, c, clk, prefix+"lease", prefix+"win")
		})
	}
}

func redisZ(expiry time.Time, member string) redis.Z {
	return redis.Z{Score: float64(expiry.UnixMilli()), Member: member}
}

// The client renews what it holds by itself, every RenewEvery of its
// clock, pushing each lease a whole LeaseTTL past that moment.
func TestLeasesRenewedEveryThirdOfTheLease(t *testing.T) {
	url := testenv.RedisURL(t)
	rdb := redistest.Client(t, url)
	set := redistest.Prefix(t, url) + "lease"
	clk := clock.NewFake(time.Now().Truncate(time.Second))
	const ttl = 30 * time.Second
	c := openAt(t, url, clk, ttl)
	h := c.NewHolder()
	if _, ok := admitLease(t, c, set, h, 1, clk.Now(), "", 0); !ok {
		t.Fatal("not admitted")
	}
	c.Hold(set, h)
	// The renewer arms its timer in its own goroutine: moving the clock
	// before that would leave the timer a whole period in the future.
	for {
		armed := clk.TimerArmed()
		if clk.Timers() > 0 {
			break
		}
		select {
		case <-armed:
		case <-time.After(10 * time.Second):
			t.Fatal("the renewer never armed its timer")
		}
	}
	want := float64(clk.Now().Add(ttl / 3).Add(ttl).UnixMilli())
	armed := clk.TimerArmed()
	clk.Advance(ttl / 3)
	// The renewal runs in the client's goroutine: wait for it to re-arm
	// its timer, which it does once the renewal call returned.
	select {
	case <-armed:
	case <-time.After(10 * time.Second):
		t.Fatal("the renewer never ran")
	}
	deadline := time.Now().Add(10 * time.Second)
	for rdb.ZScore(context.Background(), set, h).Val() != want {
		if time.Now().After(deadline) {
			t.Fatalf("lease expiry %v, want %v after one renewal period", rdb.ZScore(context.Background(), set, h).Val(), want)
		}
		time.Sleep(5 * time.Millisecond) // Redis has no event to wait on
	}
	c.Release(set, h, nil)
}

// Releases still queued when the client closes are sent, not dropped: a
// sidecar shutting down gives back the slots of the requests it finished.
func TestReleasesQueuedAtCloseAreSent(t *testing.T) {
	url := testenv.RedisURL(t)
	rdb := redistest.Client(t, url)
	set := redistest.Prefix(t, url) + "lease"
	c, err := Open(Config{URL: url, DialTimeout: 5 * time.Second, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second}, clock.Real{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.rdb.Close()
	if _, ok := admitLease(t, c, set, "h", 1, time.Now(), "", 0); !ok {
		t.Fatal("not admitted")
	}
	// Close's first half: the senders stop, so a release queued now can
	// only leave through drain.
	c.mu.Lock()
	c.closed = true
	close(c.done)
	c.mu.Unlock()
	c.wg.Wait()
	sent := make(chan struct{})
	op := GetOp()
	op.gates = append(op.gates, Gate{Kind: GateRelease, Key: set, Member: "h"})
	op.after = func() { close(sent) }
	c.b.ops <- op
	c.b.drain(ErrClosed)
	<-sent
	if n := rdb.ZCard(context.Background(), set).Val(); n != 0 {
		t.Fatalf("the release queued at close was not sent: %d holders left", n)
	}
}

// Renewals only move a lease's expiry later: the renewer's renewal and a
// RenewNow can overlap, and one computed earlier but applied last must
// not shorten the lease (a lease of a live holder would then expire).
func TestStaleRenewalNeverShortensALease(t *testing.T) {
	url := testenv.RedisURL(t)
	rdb := redistest.Client(t, url)
	set := redistest.Prefix(t, url) + "lease"
	clk := clock.NewFake(time.Now().Truncate(time.Second))
	c := openAt(t, url, clk, 30*time.Second)
	h := c.NewHolder()
	if _, ok := admitLease(t, c, set, h, 1, clk.Now(), "", 0); !ok {
		t.Fatal("not admitted")
	}
	ref := []leaseRef{{set, h}}
	later := clk.Now().Add(90 * time.Second).UnixMilli()
	earlier := clk.Now().Add(40 * time.Second).UnixMilli()
	for _, call := range []struct {
		name   string
		script *Script
	}{{"renew", renewScript}, {"readd", readdScript}} {
		if err := c.leaseCall(call.script, "renew", ref, later).Err(); err != nil {
			t.Fatal(err)
		}
		if err := c.leaseCall(call.script, "renew", ref, earlier).Err(); err != nil {
			t.Fatal(err)
		}
		if got := rdb.ZScore(context.Background(), set, h).Val(); got != float64(later) {
			t.Errorf("%s: lease expiry %v after a stale call, want %v", call.name, got, later)
		}
	}
	// A lease that is gone is added back with the expiry given.
	rdb.ZRem(context.Background(), set, h)
	if err := c.leaseCall(readdScript, "renew", ref, earlier).Err(); err != nil {
		t.Fatal(err)
	}
	if got := rdb.ZScore(context.Background(), set, h).Val(); got != float64(earlier) {
		t.Errorf("readd of a lost lease: expiry %v, want %v", got, earlier)
	}
}
