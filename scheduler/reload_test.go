package scheduler

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/warden-dev/warden/governor"
	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/governor/window"
	"github.com/warden-dev/warden/policy"
)

func TestReload(t *testing.T) {
	g := newGates()
	w := newGatedWorker(t, g)
	sched := func(lanes string, defs string) string {
		return policyYAML(w.srv.URL, "\n  lanes: "+lanes+"\n  definitions:\n"+defs, "")
	}
	both := "    job: {}\n    legacy: {}"
	h := newHarness(t, sched("1", both))
	a := h.submit(`{"name":"job"}`)
	w.next(t)
	b := h.submit(`{"name":"job"}`)
	c := h.submit(`{"name":"legacy"}`)

	// More lanes take effect at once.
	if err := h.reload(sched("2", both)); err != nil {
		t.Fatal(err)
	}
	if d := w.next(t); d.id != b.ID {
		t.Fatalf("after raising lanes delivered %s, want %s", d.id, b.ID)
	}
	if v := h.get(c.ID); deref(v.Control) != "lanes" {
		t.Fatalf("legacy run control %s", deref(v.Control))
	}

	// A definition removed by a reload: its runs wait, naming it, and new
	// submissions of it are refused.
	if err := h.reload(sched("5", "    job: {}")); err != nil {
		t.Fatal(err)
	}
	h.settle()
	if v := h.get(c.ID); v.Status != "QUEUED" || deref(v.Control) != "definition" {
		t.Fatalf("run of a removed definition: %s/%s, want QUEUED definition", v.Status, deref(v.Control))
	}
	if r := h.do("POST", "", `{"name":"legacy"}`); r.code != 400 || !strings.Contains(string(r.body), "unknown definition") {
		t.Fatalf("submit of a removed definition: %d %s", r.code, r.body)
	}
	queues := h.sched.Queues()
	found := false
	for _, q := range queues {
		if q.Scope == "definition" && q.Definition == "legacy" {
			found = q.Depth == 1 && q.Control == "definition"
		}
	}
	if !found {
		t.Fatalf("queues do not show the stranded run: %+v", queues)
	}

	// Back again: the run is delivered.
	if err := h.reload(sched("5", both)); err != nil {
		t.Fatal(err)
	}
	if d := w.next(t); d.id != c.ID {
		t.Fatalf("after restoring the definition delivered %s", d.id)
	}
	for _, id := range []string{a.ID, b.ID, c.ID} {
		g.release(id)
		h.waitStatus(id, "COMPLETED")
	}

	// The store cannot change under a running scheduler.
	err := h.reload(strings.Replace(sched("5", both), "scheduler:\n", "scheduler:\n  store: { kind: memory }\n", 1))
	if err != nil {
		t.Fatalf("harness stores are injected; kind is not enforced: %v", err)
	}
}

func TestQueuesAndMetrics(t *testing.T) {
	g := newGates()
	w := newGatedWorker(t, g)
	h := newHarness(t, policyYAML(w.srv.URL, `
  lanes: 10
  definitions:
    sync: { key: "${input.t}", key_concurrency: 1, pool: partner }`, "pools:\n  partner: { concurrency: 2 }\n"), withFakeClock())
	var ids []string
	for _, tenant := range []string{"acme", "acme", "acme", "globex", "initech"} {
		ids = append(ids, h.submit(`{"name":"sync","input":{"t":"`+tenant+`"}}`).ID)
		h.fake.Advance(1e9)
	}
	w.next(t)
	w.next(t)
	got := map[string]QueueState{}
	for _, q := range h.sched.Queues() {
		k := q.Scope + ":" + q.Definition + q.Pool
		if q.Key != nil {
			k += ":" + *q.Key
		}
		got[k] = q
	}
	want := map[string]QueueState{
		"definition:sync":  {Depth: 3, Running: 2, OldestAgeSeconds: 4, Control: "pool_concurrency"}, // its best runnable key waits for the pool
		"key:sync:acme":    {Depth: 2, Running: 1, OldestAgeSeconds: 4, Control: "key_concurrency"},
		"key:sync:globex":  {Depth: 0, Running: 1},
		"key:sync:initech": {Depth: 1, Running: 0, OldestAgeSeconds: 1, Control: "pool_concurrency"},
		"pool:partner":     {Depth: 3, Running: 2, OldestAgeSeconds: 4, Control: "pool_concurrency"},
	}
	for k, wq := range want {
		q, ok := got[k]
		if !ok || q.Depth != wq.Depth || q.Running != wq.Running || q.OldestAgeSeconds != wq.OldestAgeSeconds || q.Control != wq.Control {
			t.Errorf("%s: %+v, want depth %d running %d oldest %v control %q", k, q, wq.Depth, wq.Running, wq.OldestAgeSeconds, wq.Control)
		}
	}
	if v := value(h.m.Runs.WithLabelValues("QUEUED")); v != 3 {
		t.Errorf("warden_runs{QUEUED} = %v", v)
	}
	if v := value(h.m.Runs.WithLabelValues("RUNNING")); v != 2 {
		t.Errorf("warden_runs{RUNNING} = %v", v)
	}
	if v := value(h.m.Rejections.WithLabelValues("key_concurrency", "run:sync")); v != 2 {
		t.Errorf("warden_rejections_total{key_concurrency} = %v, want 2", v)
	}
	for _, id := range ids {
		g.release(id)
	}
	for _, id := range ids {
		h.waitStatus(id, "COMPLETED")
	}
	if v := value(h.m.Runs.WithLabelValues("COMPLETED")); v != 5 {
		t.Errorf("warden_runs{COMPLETED} = %v", v)
	}
	var m dto.Metric
	h.m.RunQueueWait.WithLabelValues("sync").(prometheus.Histogram).Write(&m)
	if n := m.GetHistogram().GetSampleCount(); n != 5 {
		t.Errorf("warden_run_queue_wait_seconds{sync} has %d samples, want one per admission (5)", n)
	}
}

// value reads a gauge or a counter.
func value(m prometheus.Metric) float64 {
	var d dto.Metric
	m.Write(&d)
	if d.Gauge != nil {
		return d.GetGauge().GetValue()
	}
	return d.GetCounter().GetValue()
}

// A postgres store that cannot be reached at start is an error naming it;
// nothing is left running.
func TestUnreachableStoreIsAnError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // a port nothing listens on
	p := policyYAML("http://127.0.0.1:9", `
  store: { kind: postgres, url: "postgres://warden@`+addr+`/x?connect_timeout=2" }
  definitions:
    job: {}`, "")
	pol, err := policy.Parse("p.yaml", []byte(p))
	if err != nil {
		t.Fatal(err)
	}
	s := New(Options{DataDir: t.TempDir()})
	err = s.Apply(context.Background(), governor.New(clock.Real{}, nil, window.NewMemory(clock.Real{})).Apply(pol))
	if err == nil || !strings.Contains(err.Error(), "run store") || !strings.Contains(err.Error(), addr) {
		t.Fatalf("Apply with a postgres store: %v", err)
	}
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// Removing the scheduler section stops it (draining, store kept); adding
// it back starts it again with the runs the store holds.
func TestSectionRemovedAndRestored(t *testing.T) {
	g := newGates()
	w := newGatedWorker(t, g)
	with := policyYAML(w.srv.URL, `
  lanes: 1
  definitions:
    job: {}`, "")
	h := newHarness(t, with)
	first := h.submit(`{"name":"job"}`)
	second := h.submit(`{"name":"job"}`)
	w.next(t)
	without := strings.Replace(with, "scheduler:\n", "", 1)
	without = without[:strings.Index(without, "\n  lanes: 1")] + "\n"
	reloaded := make(chan error, 1)
	go func() { reloaded <- h.reload(without) }()
	h.waitUntil("draining", func(s *Scheduler) bool { return s.draining })
	g.release(first.ID) // the delivery in flight finishes within the grace
	if err := recv(t, reloaded, "the reload"); err != nil {
		t.Fatalf("reload without a scheduler: %v", err)
	}
	// Off is not unready: a sidecar without a scheduler section serves
	// everything else, so /readyz must not fail because of it.
	if err := h.sched.Ready(); err != nil {
		t.Fatalf("scheduler without its section makes the sidecar unready: %v", err)
	}
	if r := h.do("GET", "/"+first.ID, ""); r.code != 503 {
		t.Fatalf("API while stopped: %d %s", r.code, r.body)
	}
	if err := h.reload(with); err != nil {
		t.Fatal(err)
	}
	if v := h.waitStatus(first.ID, "COMPLETED"); v.Attempt != 1 {
		t.Fatalf("first run: %+v", v)
	}
	d := w.next(t)
	if d.id != second.ID {
		t.Fatalf("after restart delivered %s, want %s", d.id, second.ID)
	}
	g.release(second.ID)
	h.waitStatus(second.ID, "COMPLETED")
}
