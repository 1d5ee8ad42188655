package scheduler

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// gates lets a test hold each run at the worker until it releases it.
type gates struct {
	mu     sync.Mutex
	ch     map[string]chan struct{}
	opened bool // every gate is open: the test is over
}

func newGates() *gates { return &gates{ch: map[string]chan struct{}{}} }

func (g *gates) get(id string) chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	c := g.ch[id]
	if c == nil {
		c = make(chan struct{})
		if g.opened {
			close(c)
		}
		g.ch[id] = c
	}
	return c
}

func (g *gates) wait(id string)    { <-g.get(id) }
func (g *gates) release(id string) { close(g.get(id)) }

// openAll releases every held run, so that a test that failed half way
// still lets its worker shut down.
func (g *gates) openAll() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.opened = true
	for _, c := range g.ch {
		select {
		case <-c:
		default:
			close(c)
		}
	}
}

func TestLanesBoundTheWorker(t *testing.T) {
	w := newWorker(t, func(delivery) (int, string) {
		time.Sleep(2 * time.Millisecond) // the work itself
		return http.StatusOK, `{"done":true}`
	})
	h := newHarness(t, policyYAML(w.srv.URL, `
  lanes: 5
  worker_max_concurrent: 10
  definitions:
    job: {}`, ""))
	const n = 200
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := h.do("POST", "", fmt.Sprintf(`{"name":"job","input":{"i":%d}}`, i))
			if r.code != http.StatusAccepted {
				t.Errorf("submit %d: %d %s", i, r.code, r.body)
				return
			}
			v := r.run(t)
			if v.Status == "QUEUED" && (!v.AwaitingAdmission || deref(v.Control) != "lanes") {
				t.Errorf("queued run %s: awaiting=%v control=%s, want lanes", v.ID, v.AwaitingAdmission, deref(v.Control))
			}
			ids[i] = v.ID
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	for _, id := range ids {
		h.waitStatus(id, "COMPLETED")
	}
	if got := w.max(); got != 5 {
		t.Fatalf("the worker ran at most %d runs at once, want exactly the 5 lanes", got)
	}
	if got := len(w.deliveries()); got != n {
		t.Fatalf("the worker received %d deliveries, want %d (each run once)", got, n)
	}
	v := h.get(ids[0])
	if string(v.Output) != `{"done":true}` || v.Attempt != 1 || v.StartedAt == nil || v.FinishedAt == nil {
		t.Fatalf("completed run: %+v", v)
	}
}

func TestWorkerMaxConcurrentIsTheTighterGate(t *testing.T) {
	g := newGates()
	w := newGatedWorker(t, g)
	h := newHarness(t, policyYAML(w.srv.URL, `
  lanes: 5
  worker_max_concurrent: 2
  definitions:
    job: {}`, ""))
	var ids []string
	for range 3 {
		ids = append(ids, h.submit(`{"name":"job"}`).ID)
	}
	w.next(t)
	w.next(t)
	if v := h.get(ids[2]); v.Status != "QUEUED" || deref(v.Control) != "worker_concurrency" {
		t.Fatalf("third run %s control %s, want QUEUED worker_concurrency", v.Status, deref(v.Control))
	}
	g.release(ids[0])
	if d := w.next(t); d.id != ids[2] {
		t.Fatalf("next delivery %s, want %s", d.id, ids[2])
	}
	g.release(ids[1])
	g.release(ids[2])
	for _, id := range ids {
		h.waitStatus(id, "COMPLETED")
	}
}

// Three acme runs go one at a time while a globex run starts at once.
func TestKeyConcurrency(t *testing.T) {
	g := newGates()
	w := newGatedWorker(t, g)
	h := newHarness(t, policyYAML(w.srv.URL, `
  lanes: 10
  definitions:
    tenant_sync: { key: "${input.tenantId}", key_concurrency: 1 }`, ""))
	a1 := h.submit(`{"name":"tenant_sync","input":{"tenantId":"acme","n":1}}`)
	a2 := h.submit(`{"name":"tenant_sync","input":{"tenantId":"acme","n":2}}`)
	a3 := h.submit(`{"name":"tenant_sync","input":{"tenantId":"acme","n":3}}`)
	g1 := h.submit(`{"name":"tenant_sync","input":{"tenantId":"globex"}}`)
	if a1.Status != "RUNNING" || g1.Status != "RUNNING" {
		t.Fatalf("first acme %s and globex %s, want both admitted at once", a1.Status, g1.Status)
	}
	for _, v := range []RunView{a2, a3} {
		if v.Status != "QUEUED" || !v.AwaitingAdmission || deref(v.Control) != "key_concurrency" {
			t.Fatalf("later acme run: %s awaiting=%v control=%s, want QUEUED key_concurrency", v.Status, v.AwaitingAdmission, deref(v.Control))
		}
	}
	first := map[string]bool{w.next(t).id: true, w.next(t).id: true}
	if !first[a1.ID] || !first[g1.ID] {
		t.Fatalf("first deliveries %v, want acme 1 and globex", first)
	}
	g.release(a1.ID)
	if d := w.next(t); d.id != a2.ID {
		t.Fatalf("after acme 1: %s, want acme 2", d.id)
	}
	if v := h.get(a3.ID); deref(v.Control) != "key_concurrency" {
		t.Fatalf("acme 3 control %s", deref(v.Control))
	}
	g.release(g1.ID)
	h.waitStatus(g1.ID, "COMPLETED")
	if v := h.get(a3.ID); v.Status != "QUEUED" {
		t.Fatalf("globex finishing admitted acme 3 (%s)", v.Status)
	}
	g.release(a2.ID)
	if d := w.next(t); d.id != a3.ID {
		t.Fatalf("after acme 2: %s, want acme 3", d.id)
	}
	g.release(a3.ID)
	h.waitStatus(a3.ID, "COMPLETED")
	if v := h.get(a1.ID); v.Key != "acme" {
		t.Fatalf("run key %q, want acme", v.Key)
	}
}

// A key expression that resolves to nothing shares the bucket named by the
// expression: unkeyed runs are limited together, not exempt.
func TestUnresolvedKeySharesTheExpressionBucket(t *testing.T) {
	g := newGates()
	w := newGatedWorker(t, g)
	h := newHarness(t, policyYAML(w.srv.URL, `
  definitions:
    sync: { key: "t-${header.x-tenant-id}", key_concurrency: 1 }`, ""))
	a := h.submit(`{"name":"sync"}`)
	b := h.submit(`{"name":"sync","input":{}}`)
	c := h.submit(`{"name":"sync"}`, "x-tenant-id", "acme")
	if a.Status != "RUNNING" || b.Status != "QUEUED" || deref(b.Control) != "key_concurrency" || c.Status != "RUNNING" {
		t.Fatalf("a %s, b %s/%s, c %s: want the unkeyed pair serialised and acme free", a.Status, b.Status, deref(b.Control), c.Status)
	}
	if k := h.get(b.ID).Key; k != "t-${header.x-tenant-id}" {
		t.Fatalf("unresolved key %q, want the expression", k)
	}
	d1, d2 := w.next(t), w.next(t)
	tenants := map[string]string{d1.id: d1.tenant, d2.id: d2.tenant}
	if tenants[c.ID] != "acme" || tenants[a.ID] != "" {
		t.Fatalf("x-tenant-id delivered %v, want acme for the run submitted with it", tenants)
	}
	for _, id := range []string{a.ID, b.ID, c.ID} {
		g.release(id)
	}
	h.waitStatus(b.ID, "COMPLETED")
}

func TestPriorityThenAge(t *testing.T) {
	g := newGates()
	w := newGatedWorker(t, g)
	h := newHarness(t, policyYAML(w.srv.URL, `
  lanes: 1
  definitions:
    job: { priority: 0 }
    urgent: { priority: 5 }`, ""))
	blocker := h.submit(`{"name":"job"}`)
	w.next(t)
	low := h.submit(`{"name":"job","priority":-1}`)
	mid1 := h.submit(`{"name":"job"}`)
	high := h.submit(`{"name":"urgent"}`)
	mid2 := h.submit(`{"name":"job"}`)
	top := h.submit(`{"name":"job","priority":9}`)
	want := []RunView{top, high, mid1, mid2, low}
	prev := blocker.ID
	for _, v := range want {
		g.release(prev)
		d := w.next(t)
		if d.id != v.ID {
			t.Fatalf("delivered %s after %s, want %s (priority %d)", d.id, prev, v.ID, h.get(v.ID).Priority)
		}
		prev = d.id
	}
	g.release(prev)
	h.waitStatus(prev, "COMPLETED")
}

// A run held only by its own pool does not block a run of another
// definition, whatever their priorities.
func TestBlockedPoolDoesNotBlockOthers(t *testing.T) {
	g := newGates()
	w := newGatedWorker(t, g)
	h := newHarness(t, policyYAML(w.srv.URL, `
  lanes: 10
  definitions:
    charge: { pool: stripe, priority: 10 }
    report: {}`, "pools:\n  stripe: { concurrency: 1 }\n"))
	c1 := h.submit(`{"name":"charge"}`)
	c2 := h.submit(`{"name":"charge"}`)
	r1 := h.submit(`{"name":"report"}`)
	if c2.Status != "QUEUED" || deref(c2.Control) != "pool_concurrency" {
		t.Fatalf("second charge %s/%s, want QUEUED pool_concurrency", c2.Status, deref(c2.Control))
	}
	if r1.Status != "RUNNING" {
		t.Fatalf("report run %s: a full pool of another definition blocked it", r1.Status)
	}
	got := map[string]bool{w.next(t).id: true, w.next(t).id: true}
	if !got[c1.ID] || !got[r1.ID] {
		t.Fatalf("deliveries %v", got)
	}
	g.release(c1.ID)
	if d := w.next(t); d.id != c2.ID {
		t.Fatalf("pool slot freed: delivered %s, want %s", d.id, c2.ID)
	}
	g.release(c2.ID)
	g.release(r1.ID)
	h.waitStatus(c2.ID, "COMPLETED")
}

// A pool with rate 3 per 60 s admits 3 runs and releases the rest at the
// window's boundary, without polling: the boundary wakes the scheduler.
func TestPoolRateReleasesAtTheBoundary(t *testing.T) {
	w := newWorker(t, nil)
	h := newHarness(t, policyYAML(w.srv.URL, `
  lanes: 10
  definitions:
    sync: { pool: partner }`, "pools:\n  partner: { rate: 3, window: 60 }\n"), withFakeClock())
	var ids []string
	for range 5 {
		ids = append(ids, h.submit(`{"name":"sync"}`).ID)
	}
	for _, id := range ids[:3] {
		h.waitStatus(id, "COMPLETED")
	}
	for _, id := range ids[3:] {
		if v := h.get(id); v.Status != "QUEUED" || deref(v.Control) != "pool_rate" {
			t.Fatalf("run %s: %s/%s, want QUEUED pool_rate", id, v.Status, deref(v.Control))
		}
	}
	if n := len(w.deliveries()); n != 3 {
		t.Fatalf("%d deliveries in the first window, want 3", n)
	}
	h.fake.Advance(42 * time.Second) // 12:00:59
	h.settle()
	if v := h.get(ids[3]); v.Status != "QUEUED" {
		t.Fatalf("released before the boundary: %s", v.Status)
	}
	h.fake.Advance(time.Second) // 12:01:00
	for _, id := range ids[3:] {
		h.waitStatus(id, "COMPLETED")
	}
	if n := len(w.deliveries()); n != 5 {
		t.Fatalf("%d deliveries, want 5", n)
	}
}

// A semaphore shared by two definitions never has more holders than
// permits.
func TestSemaphoreSharedByDefinitions(t *testing.T) {
	g := newGates()
	w := newGatedWorker(t, g)
	h := newHarness(t, policyYAML(w.srv.URL, `
  lanes: 10
  semaphores: { legacy_erp: 2 }
  definitions:
    export: { semaphores: [legacy_erp] }
    import: { semaphores: [legacy_erp] }`, ""))
	var ids []string
	for i := range 6 {
		name := []string{"export", "import"}[i%2]
		ids = append(ids, h.submit(fmt.Sprintf(`{"name":%q}`, name)).ID)
	}
	w.next(t)
	w.next(t)
	for _, id := range ids[2:] {
		if v := h.get(id); deref(v.Control) != "semaphore" {
			t.Fatalf("run %s control %s, want semaphore", id, deref(v.Control))
		}
	}
	if s := h.sched.Semaphores(); len(s) != 1 || s[0] != (SemaphoreState{"legacy_erp", 2, 2}) {
		t.Fatalf("semaphores %+v", s)
	}
	for i, id := range ids {
		g.release(id)
		if i+2 < len(ids) {
			w.next(t)
		}
	}
	for _, id := range ids {
		h.waitStatus(id, "COMPLETED")
	}
	if m := w.max(); m != 2 {
		t.Fatalf("at most %d held the semaphore at the worker, want 2", m)
	}
	h.waitUntil("every permit is returned", func(s *Scheduler) bool { return len(s.sems["legacy_erp"].holders) == 0 })
}

// A worker that took a run (202) and crashed never heartbeats: its permit
// returns when the lease ends and the sweeper passes.
func TestCrashedHolderPermitReturnsAfterLease(t *testing.T) {
	w := newWorker(t, func(d delivery) (int, string) {
		if d.body == `{"crash":true}` {
			return http.StatusAccepted, ""
		}
		return 200, "{}"
	})
	h := newHarness(t, policyYAML(w.srv.URL, `
  lanes: 10
  semaphores: { erp: 1 }
  definitions:
    export: { semaphores: [erp] }`, ""), withFakeClock())
	holder := h.submit(`{"name":"export","input":{"crash":true}}`)
	h.waitPhase(holder.ID, phaseAsync)
	next := h.submit(`{"name":"export"}`)
	if next.Status != "QUEUED" || deref(next.Control) != "semaphore" {
		t.Fatalf("second run %s/%s, want QUEUED semaphore", next.Status, deref(next.Control))
	}
	h.fake.Advance(permitLease - time.Second)
	h.settle()
	if v := h.get(next.ID); v.Status != "QUEUED" {
		t.Fatalf("permit returned before the lease ended: %s", v.Status)
	}
	h.fake.Advance(time.Second)
	h.waitStatus(next.ID, "COMPLETED")
	if v := h.get(holder.ID); v.Status != "RUNNING" {
		t.Fatalf("the crashed holder's run is %s; the sweeper frees only its permit", v.Status)
	}
}

// idParts cuts a run id of any store into its scope ("" for a shared
// store's bare sequence) and its sequence.
func idParts(id string) (scope string, seq uint64) {
	scope, n, scoped := strings.Cut(id, "-")
	if !scoped {
		scope, n = "", id
	}
	seq, err := strconv.ParseUint(n, 10, 64)
	if err != nil || seq == 0 {
		panic("bad id " + id)
	}
	return scope, seq
}

// mustSeq is the store sequence of a run id of any store.
func mustSeq(id string) uint64 {
	_, seq := idParts(id)
	return seq
}
