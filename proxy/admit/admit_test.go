package admit

import (
	"context"
	"testing"
	"time"

	"github.com/warden-dev/warden/governor/breaker"
	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/control"
	"github.com/warden-dev/warden/governor/pool"
	"github.com/warden-dev/warden/governor/tenant"
	"github.com/warden-dev/warden/governor/window"
	"github.com/warden-dev/warden/policy"
)

var t0 = time.Date(2026, 3, 2, 10, 0, 20, 0, time.UTC)

func TestOrderAndGiveBack(t *testing.T) {
	clk := clock.NewFake(t0)
	counter := window.NewMemory(clk)
	pools := pool.NewSet([]policy.Pool{
		{Name: "rated", Rate: 5, Window: 60},
		{Name: "full", Concurrency: 1},
	}, counter, clk, nil)
	caps := tenant.New("egress", &policy.TenantCap{Header: "x-tenant-id", Rate: 100, Window: 60}, nil, counter, nil)
	b := breaker.New("api", policy.CircuitBreaker{Enabled: true, FailureRatio: 0.5, MinimumRequests: 1, Window: time.Minute, Open: 5 * time.Second, MaxOpen: time.Minute}, clk)
	tg := &Target{Name: "api", Breaker: b, Pools: []*pool.Pool{pools.Get("rated"), pools.Get("full")}}

	var held Admission
	if _, ok := Admit(context.Background(), &held, tg, caps, []byte("acme"), "egress", t0); !ok {
		t.Fatal("first request refused")
	}
	// "full" has no room: the rate slot "rated" granted is given back.
	var second Admission
	ref, ok := Admit(context.Background(), &second, tg, caps, []byte("acme"), "egress", t0)
	if ok || ref.Control != control.PoolQueue || ref.Scope != "full" || ref.Pool == nil {
		t.Fatalf("second request: %+v ok=%v", ref, ok)
	}
	if s := pools.Get("rated").Snapshot(t0); s.Count != 1 {
		t.Fatalf("refused request kept its rate slot: count %d", s.Count)
	}
	held.Ticket.Done(breaker.Failure)
	held.Release()
	// The breaker opened on the failure: refused before any pool is asked.
	var third Admission
	ref, ok = Admit(context.Background(), &third, tg, caps, []byte("acme"), "egress", t0)
	if ok || ref.Control != "circuit_breaker" || ref.Scope != "api" || ref.RetryAfter != 5*time.Second {
		t.Fatalf("open breaker: %+v ok=%v", ref, ok)
	}
	if s := pools.Get("rated").Snapshot(t0); s.Count != 1 {
		t.Fatalf("a request the breaker refused took a rate slot: count %d", s.Count)
	}
	// The tenant cap comes first of all.
	small := tenant.New("egress", &policy.TenantCap{Header: "x-tenant-id", Rate: 1, Window: 60}, nil, counter, nil)
	small.Check([]byte("acme"), t0)
	ref, ok = Admit(context.Background(), &third, tg, small, []byte("acme"), "egress", t0)
	if ok || ref.Control != control.TenantRate || ref.Scope != "egress" || ref.Tenant.Quota() != "tenant:acme" {
		t.Fatalf("tenant cap: %+v ok=%v", ref, ok)
	}
}

func TestHalfOpenProbeGivenBackOnPoolRefusal(t *testing.T) {
	clk := clock.NewFake(t0)
	counter := window.NewMemory(clk)
	pools := pool.NewSet([]policy.Pool{{Name: "full", Concurrency: 1}}, counter, clk, nil)
	b := breaker.New("api", policy.CircuitBreaker{Enabled: true, FailureRatio: 0.5, MinimumRequests: 1, Window: time.Minute, Open: 5 * time.Second, MaxOpen: time.Minute}, clk)
	tk, _, _ := b.Allow()
	tk.Done(breaker.Failure)
	clk.Advance(5 * time.Second)
	occupant, _ := pools.Get("full").Acquire(context.Background(), 0, t0)
	tg := &Target{Name: "api", Breaker: b, Pools: []*pool.Pool{pools.Get("full")}}
	var a Admission
	if _, ok := Admit(context.Background(), &a, tg, nil, nil, "egress", clk.Now()); ok {
		t.Fatal("admitted through a full pool")
	}
	occupant.Release()
	// The probe slot taken before the pool refused is free again.
	if _, ok := Admit(context.Background(), &a, tg, nil, nil, "egress", clk.Now()); !ok {
		t.Fatal("the half-open probe slot was not given back")
	}
}

// The half-open probe waits in a pool's queue as any request does (SPEC
// §4), and goes when the slot frees; meanwhile the others fail fast.
func TestHalfOpenProbeQueues(t *testing.T) {
	clk := clock.NewFake(t0)
	counter := window.NewMemory(clk)
	pools := pool.NewSet([]policy.Pool{{Name: "full", Concurrency: 1, Queue: 10, MaxWait: time.Hour}}, counter, clk, nil)
	b := breaker.New("api", policy.CircuitBreaker{Enabled: true, FailureRatio: 0.5, MinimumRequests: 1, Window: time.Minute, Open: 5 * time.Second, MaxOpen: time.Minute}, clk)
	tk, _, _ := b.Allow()
	tk.Done(breaker.Failure)
	clk.Advance(5 * time.Second)
	occupant, _ := pools.Get("full").Acquire(context.Background(), 0, clk.Now())
	tg := &Target{Name: "api", Breaker: b, Pools: []*pool.Pool{pools.Get("full")}}
	type result struct {
		ref Refusal
		ok  bool
	}
	done := make(chan result, 1)
	var probe Admission
	go func() {
		ref, ok := Admit(context.Background(), &probe, tg, nil, nil, "egress", clk.Now())
		done <- result{ref, ok}
	}()
	for pools.Get("full").Snapshot(clk.Now()).Queued != 1 {
		select {
		case r := <-done:
			t.Fatalf("probe through a full pool with queue room: %+v ok=%v, want it queued", r.ref, r.ok)
		case <-time.After(time.Millisecond):
		}
	}
	// While the probe waits, everyone else fails fast.
	var other Admission
	if ref, ok := Admit(context.Background(), &other, tg, nil, nil, "egress", clk.Now()); ok || ref.Control != "circuit_breaker" {
		t.Fatalf("a second request during the probe: %+v ok=%v", ref, ok)
	}
	occupant.Release()
	if r := <-done; !r.ok {
		t.Fatalf("queued probe refused: %+v", r.ref)
	}
	probe.Ticket.Done(breaker.Success)
	probe.Release()
	if b.State() != breaker.Closed {
		t.Fatalf("breaker %v after a successful probe", b.State())
	}
}

// TestAsk: Ask counts the tenant as Admit would and refuses on an open
// breaker or a pool that would refuse at once, but leaves the half-open
// probe, and every pool slot, to Admit.
func TestAsk(t *testing.T) {
	clk := clock.NewFake(t0)
	counter := window.NewMemory(clk)
	pools := pool.NewSet([]policy.Pool{{Name: "full", Concurrency: 1}}, counter, clk, nil)
	caps := tenant.New("egress", &policy.TenantCap{Header: "x-tenant-id", Rate: 1, Window: 60}, nil, counter, nil)
	b := breaker.New("api", policy.CircuitBreaker{Enabled: true, FailureRatio: 0.5, MinimumRequests: 1, Window: time.Minute, Open: 5 * time.Second, MaxOpen: time.Minute}, clk)
	tg := &Target{Name: "api", Breaker: b, Pools: []*pool.Pool{pools.Get("full")}}

	if _, ok := Ask(tg, caps, []byte("acme"), "egress", t0); !ok {
		t.Fatal("first ask refused")
	}
	if s := pools.Get("full").Snapshot(t0); s.InFlight != 0 {
		t.Fatalf("Ask took a pool slot: %+v", s)
	}
	if ref, ok := Ask(tg, caps, []byte("acme"), "egress", t0); ok || ref.Control != control.TenantRate || ref.Scope != "egress" {
		t.Fatalf("second ask, over the cap of 1: %+v ok=%v (the first was not counted?)", ref, ok)
	}
	tk, _, _ := b.Allow()
	tk.Done(breaker.Failure)
	if ref, ok := Ask(tg, nil, nil, "egress", t0); ok || ref.Control != "circuit_breaker" || ref.Scope != "api" || ref.RetryAfter != 5*time.Second {
		t.Fatalf("open breaker: %+v ok=%v", ref, ok)
	}
	clk.Advance(5 * time.Second)
	if _, ok := Ask(tg, nil, nil, "egress", clk.Now()); !ok {
		t.Fatal("ask after open refused")
	}
	var a Admission
	if _, ok := Admit(context.Background(), &a, tg, nil, nil, "egress", clk.Now()); !ok || !a.Ticket.Probe() {
		t.Fatalf("Admit after Ask: ok=%v probe=%v; want the half-open probe", ok, a.Ticket.Probe())
	}
	a.Ticket.Done(breaker.Success)
	// The breaker closed, the pool's one slot still held and no queue: the
	// pool would refuse at once, and Ask says so before any body comes.
	if ref, ok := Ask(tg, nil, nil, "egress", clk.Now()); ok || ref.Control != control.PoolQueue || ref.Scope != "full" || ref.Pool == nil {
		t.Fatalf("full pool: %+v ok=%v, want pool_queue", ref, ok)
	}
	a.Release()
}
