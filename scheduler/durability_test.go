package scheduler

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warden-dev/warden/proxy/respond"
	"github.com/warden-dev/warden/scheduler/store"
)

// SIGTERM's drain: admission stops, the delivery in flight finishes within
// the grace, runs submitted meanwhile are stored, and a restart delivers
// everything still queued.
func TestDrainFinishesInFlightAndKeepsTheQueue(t *testing.T) {
	dir := t.TempDir()
	g := newGates()
	w := newGatedWorker(t, g)
	yaml := policyYAML(w.srv.URL, `
  lanes: 1
  definitions:
    job: {}`, "")
	h := newHarness(t, yaml, withDataDir(dir))
	first := h.submit(`{"name":"job"}`)
	second := h.submit(`{"name":"job"}`)
	w.next(t)
	errc := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		errc <- h.sched.Shutdown(ctx)
	}()
	h.waitUntil("draining", func(s *Scheduler) bool { return s.draining })
	during := h.submit(`{"name":"job"}`)
	if during.Status != "QUEUED" {
		t.Fatalf("run submitted during the drain is %s, want QUEUED", during.Status)
	}
	g.release(first.ID)
	if err := recv(t, errc, "the drain"); err != nil {
		t.Fatalf("drain: %v", err)
	}
	if n := len(w.deliveries()); n != 1 {
		t.Fatalf("%d deliveries during the drain, want only the one in flight", n)
	}

	h2 := newHarness(t, yaml, withDataDir(dir))
	if v := h2.get(first.ID); v.Status != "COMPLETED" {
		t.Fatalf("run in flight at SIGTERM is %s after restart", v.Status)
	}
	for _, id := range []string{second.ID, during.ID} {
		if d := w.next(t); d.id != id {
			t.Fatalf("after restart delivered %s, want %s", d.id, id)
		}
		g.release(id)
		h2.waitStatus(id, "COMPLETED")
	}
}

// A delivery still in flight when the grace ends is abandoned in STARTING;
// on restart it returns to the queue, its rate slot refunded (the pool's
// window survives here as it would in a shared backend), and is delivered
// again with the next attempt number.
func TestInterruptedStartIsRequeuedWithRefund(t *testing.T) {
	dir := t.TempDir()
	g := newGates()
	w := newWorker(t, func(d delivery) (int, string) {
		if d.attempt == "1" {
			g.wait(d.id)
		}
		return 200, "{}"
	}, g)
	yaml := policyYAML(w.srv.URL, `
  lanes: 1
  definitions:
    job: { pool: partner }`, "pools:\n  partner: { rate: 1, window: 60 }\n")
	h := newHarness(t, yaml, withDataDir(dir), withFakeClock())
	run := h.submit(`{"name":"job"}`)
	w.next(t)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	err := h.sched.Shutdown(ctx)
	cancel()
	if err != nil {
		t.Fatalf("drain past the grace: %v; running out of grace is not an error", err)
	}
	g.release(run.ID)
	st, err := store.OpenBolt(filepath.Join(dir, StoreFile))
	if err != nil {
		t.Fatal(err)
	}
	if r, _ := st.Get(context.Background(), mustSeq(run.ID)); r.Status != store.Starting {
		t.Fatalf("abandoned delivery stored as %s, want STARTING", r.Status)
	}
	st.Close()
	if snap := h.gov.Current().Pools.Get("partner").Snapshot(h.fake.Now()); snap.Count != 1 {
		t.Fatalf("pool count %d before restart, want the interrupted admission's 1", snap.Count)
	}

	h2 := newHarness(t, yaml, withDataDir(dir), withGovernor(h.gov, h.fake))
	d := w.next(t)
	if d.id != run.ID || d.attempt != "2" {
		t.Fatalf("after restart: run %s attempt %s, want %s attempt 2", d.id, d.attempt, run.ID)
	}
	v := h2.waitStatus(run.ID, "COMPLETED")
	if v.Attempt != 2 {
		t.Fatalf("attempt %d", v.Attempt)
	}
	if snap := h.gov.Current().Pools.Get("partner").Snapshot(h.fake.Now()); snap.Count != 1 {
		t.Fatalf("pool count %d after the redelivery, want 1: the interrupted slot was refunded", snap.Count)
	}
}

// A run the worker accepted (202) before a restart stays RUNNING and holds
// its lane: the worker may still complete it.
func TestAcceptedRunSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	w := newWorker(t, func(delivery) (int, string) { return 202, "" })
	yaml := policyYAML(w.srv.URL, `
  lanes: 1
  definitions:
    job: {}`, "")
	h := newHarness(t, yaml, withDataDir(dir))
	a := h.submit(`{"name":"job"}`)
	h.waitPhase(a.ID, phaseAsync)
	h.waitStatus(a.ID, "RUNNING")
	b := h.submit(`{"name":"job"}`)
	h.shutdown()

	h2 := newHarness(t, yaml, withDataDir(dir))
	if v := h2.get(b.ID); v.Status != "QUEUED" || deref(v.Control) != "lanes" {
		t.Fatalf("second run %s/%s after restart: the accepted run must hold its lane", v.Status, deref(v.Control))
	}
	if r := h2.do("POST", "/"+a.ID+"/complete", `{"status":"COMPLETED","output":1}`); r.code != 200 {
		t.Fatalf("complete after restart: %d %s", r.code, r.body)
	}
	w.next(t)
	if d := w.next(t); d.id != b.ID {
		t.Fatalf("delivered %s", d.id)
	}
	// The idempotency key and the run ids survive too.
	c := h2.submit(`{"name":"job","idempotency_key":"k"}`)
	if again := h2.submit(`{"name":"job","idempotency_key":"k"}`); again.ID != c.ID {
		t.Fatal("idempotency key not honoured")
	}
	scopeA, _ := idParts(a.ID)
	if scopeC, seqC := idParts(c.ID); seqC <= 2 || scopeC != scopeA || scopeA == "" {
		t.Fatalf("id %s after restart, after %s and %s before it: want the same store scope and a later sequence", c.ID, a.ID, b.ID)
	}
}

// The per-tenant 429 of the ingress applies to runs requests like any
// other, and never cancels runs already accepted.
func TestTenantCapAppliesToRunsRequests(t *testing.T) {
	w := newWorker(t, nil)
	tenantWrap := func(h *harness, next fasthttp.RequestHandler) fasthttp.RequestHandler {
		return func(c *fasthttp.RequestCtx) {
			caps := h.gov.Current().IngressCaps
			now := h.clk.Now()
			res := caps.Check(c.Request.Header.Peek(caps.Header()), now)
			if !res.Allowed {
				respond.Tenant(c, res, now)
				return
			}
			next(c)
		}
	}
	h2 := newHarness(t, strings.Replace(policyYAML(w.srv.URL, `
  definitions:
    job: {}`, ""), "  worker:", "  tenant: { header: x-tenant-id, rate: 2, window: 60 }\n  worker:", 1), withWrap(tenantWrap))
	a := h2.submit(`{"name":"job"}`, "x-tenant-id", "acme")
	b := h2.submit(`{"name":"job"}`, "x-tenant-id", "acme")
	r := h2.do("POST", "", `{"name":"job"}`, "x-tenant-id", "acme")
	if r.code != 429 || r.hdr.Get("x-warden-control") != "tenant_rate" || !strings.Contains(string(r.body), `"quota":"tenant:acme"`) {
		t.Fatalf("third acme submit: %d %s", r.code, r.body)
	}
	if v := h2.submit(`{"name":"job"}`, "x-tenant-id", "globex"); v.ID == "" {
		t.Fatal("another tenant refused")
	}
	// Poll through the Go API: GETs would count against the cap too.
	for _, id := range []string{a.ID, b.ID} {
		deadline := time.Now().Add(10 * time.Second)
		for {
			v, err := h2.sched.Get(context.Background(), id)
			if err == nil && v.Status == "COMPLETED" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("accepted run %s is %s after the 429", id, v.Status)
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// TestRestartAdmitsOnlyAfterRecovery: a restart that refunds an
// interrupted start's rate slot must not admit anything before the runs
// that were running hold their lanes again and the interrupted run is back
// in the queue in its place. With lanes 2, the running run and the
// interrupted one (the oldest waiting) take the lanes; of the newer runs
// only one gets in once the interrupted run completes.
func TestRestartAdmitsOnlyAfterRecovery(t *testing.T) {
	dir := t.TempDir()
	g := newGates()
	w := newWorker(t, func(d delivery) (int, string) {
		if strings.Contains(d.body, "pooled") {
			if d.attempt == "1" {
				g.wait(d.id)
			}
			return 200, "{}"
		}
		return 202, ""
	}, g)
	yaml := policyYAML(w.srv.URL, `
  lanes: 2
  definitions:
    plain: {}
    pooled: { pool: p }`, "pools:\n  p: { rate: 100, window: 60 }\n")
	h := newHarness(t, yaml, withDataDir(dir), withFakeClock())
	a := h.submit(`{"name":"plain"}`)
	h.waitStatus(a.ID, "RUNNING")
	b := h.submit(`{"name":"pooled","input":"pooled"}`)
	w.next(t)
	w.next(t)
	c := h.submit(`{"name":"plain"}`)
	d := h.submit(`{"name":"plain"}`)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	_ = h.sched.Shutdown(ctx)
	cancel()
	g.release(b.ID)

	h2 := newHarness(t, yaml, withDataDir(dir), withGovernor(h.gov, h.fake))
	h2.waitStatus(b.ID, "COMPLETED")
	h2.waitStatus(c.ID, "RUNNING")
	if v := h2.get(d.ID); v.Status != "QUEUED" || deref(v.Control) != "lanes" {
		t.Fatalf("newest run %s/%s, want QUEUED behind lanes: %s and %s hold them", v.Status, deref(v.Control), a.ID, c.ID)
	}
}

// TestRestartKeepsSemaphoreWithinPermits: a running run whose permit lease
// expired lost its permit to a later run; a restart must not give it back,
// so the semaphore never shows more holders than permits.
func TestRestartKeepsSemaphoreWithinPermits(t *testing.T) {
	dir := t.TempDir()
	w := newWorker(t, func(delivery) (int, string) { return 202, "" })
	yaml := policyYAML(w.srv.URL, `
  semaphores: { s: 1 }
  definitions:
    lease: { semaphores: [s] }`, "")
	h := newHarness(t, yaml, withDataDir(dir), withFakeClock())
	first := h.submit(`{"name":"lease"}`)
	h.waitStatus(first.ID, "RUNNING")
	second := h.submit(`{"name":"lease"}`)
	if v := h.get(second.ID); v.Status != "QUEUED" {
		t.Fatalf("second run %s, want QUEUED behind the semaphore", v.Status)
	}
	h.fake.Advance(permitLease + time.Second) // no heartbeat: the first run's lease ends
	h.waitStatus(second.ID, "RUNNING")
	h.shutdown()

	h2 := newHarness(t, yaml, withDataDir(dir), withGovernor(h.gov, h.fake))
	sems := h2.sched.Semaphores()
	if len(sems) != 1 || sems[0].Held > sems[0].Permits {
		t.Fatalf("semaphores after restart: %+v", sems)
	}
	third := h2.submit(`{"name":"lease"}`)
	if v := h2.get(third.ID); v.Status != "QUEUED" || deref(v.Control) != "semaphore" {
		t.Fatalf("third run %s/%s, want QUEUED behind the semaphore", v.Status, deref(v.Control))
	}
}
