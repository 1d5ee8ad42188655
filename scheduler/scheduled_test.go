package scheduler

import (
	"net/http"
	"testing"
	"time"
)

// A run submitted with a delay or a not_before waits SCHEDULED, outside
// the queue, and joins it at its time; one whose time has passed is queued
// at once.
func TestScheduledRun(t *testing.T) {
	w := newWorker(t, nil)
	h := newHarness(t, policyYAML(w.srv.URL, `
  definitions:
    job: { schedule_to_start_timeout: 30s }`, ""), withFakeClock())
	rc := h.submit(`{"name":"job","delay":"1h"}`)
	if rc.Status != "SCHEDULED" || rc.AwaitingAdmission || rc.Control != nil {
		t.Fatalf("receipt: %+v", rc)
	}
	at := h.submit(`{"name":"job","not_before":"` + t0.Add(2*time.Hour).UTC().Format(time.RFC3339) + `"}`).ID
	past := h.submit(`{"name":"job","not_before":"2020-01-01T00:00:00Z"}`).ID
	h.waitStatus(past, "COMPLETED")

	v := h.get(rc.ID)
	if v.Status != "SCHEDULED" || v.NotBefore == nil || !v.NotBefore.Equal(t0.Add(time.Hour)) || v.StartedAt != nil {
		t.Fatalf("scheduled run: %s not_before %v", v.Status, v.NotBefore)
	}
	var listed []RunView
	if err := jsonUnmarshal(h.do("GET", "?status=SCHEDULED", "").body, &listed); err != nil || len(listed) != 2 {
		t.Fatalf("?status=SCHEDULED: %d runs (%v)", len(listed), err)
	}
	if g := value(h.m.Runs.WithLabelValues("SCHEDULED")); g != 2 {
		t.Fatalf("warden_runs{status=SCHEDULED} = %v", g)
	}

	h.fake.Advance(time.Hour - time.Second)
	w.next(t) // the past one's
	w.none(t, h)
	h.fake.Advance(time.Second)
	if d := w.next(t); d.id != rc.ID || d.attempt != "1" {
		t.Fatalf("at its time: delivered %s attempt %s, want %s attempt 1", d.id, d.attempt, rc.ID)
	}
	h.waitStatus(rc.ID, "COMPLETED")
	// Two hours after its submit, more than schedule_to_start_timeout,
	// it is queued and delivered, not timed out: the timeout counts from
	// its time.
	h.fake.Advance(time.Hour)
	h.waitStatus(at, "COMPLETED")
	if g := value(h.m.Runs.WithLabelValues("SCHEDULED")); g != 0 {
		t.Fatalf("warden_runs{status=SCHEDULED} = %v after all ran", g)
	}
}

// A scheduled run survives a restart with its time, and a cancelled one
// never starts.
func TestScheduledRunRestartAndCancel(t *testing.T) {
	dir := t.TempDir()
	w := newWorker(t, nil)
	yaml := policyYAML(w.srv.URL, `
  definitions:
    job: {}`, "")
	h := newHarness(t, yaml, withDataDir(dir), withFakeClock())
	kept := h.submit(`{"name":"job","delay":"10m"}`).ID
	dropped := h.submit(`{"name":"job","delay":"10m"}`).ID
	h.cancel(dropped, "", "cancelled through the API")
	h.shutdown()

	h2 := newHarness(t, yaml, withDataDir(dir), withGovernor(h.gov, h.fake))
	if v := h2.get(kept); v.Status != "SCHEDULED" {
		t.Fatalf("after the restart: %s", v.Status)
	}
	h2.fake.Advance(10 * time.Minute)
	if d := w.next(t); d.id != kept {
		t.Fatalf("delivered %s, want %s", d.id, kept)
	}
	h2.waitStatus(kept, "COMPLETED")
	w.none(t, h2)
	if v := h2.get(dropped); v.Status != "CANCELLED" {
		t.Fatalf("the cancelled scheduled run is %s", v.Status)
	}
	if r := h2.do("POST", "/"+kept+"/cancel", ""); r.code != http.StatusConflict {
		t.Fatalf("cancel of a finished run: %d", r.code)
	}
}

// On a shared queue a scheduled run is seen SCHEDULED by every sidecar
// and delivered once when due.
func TestSharedStoreScheduled(t *testing.T) {
	db := newSharedDB(t)
	w := newWorker(t, nil)
	sched := `
  definitions:
    job: {}`
	a := newSidecar(t, db, w, sched, 2*time.Second)
	b := newSidecar(t, db, w, sched, 2*time.Second)
	id := a.submit(`{"name":"job","delay":"300ms"}`).ID
	if v := b.get(id); v.Status != "SCHEDULED" || v.NotBefore == nil {
		t.Fatalf("through the other sidecar: %s not_before %v", v.Status, v.NotBefore)
	}
	if d := w.next(t); d.id != id {
		t.Fatalf("delivered %s", d.id)
	}
	v := b.waitStatus(id, "COMPLETED")
	if v.StartedAt == nil || v.StartedAt.Before(*v.CreatedAt) || v.StartedAt.Sub(*v.CreatedAt) < 300*time.Millisecond {
		t.Fatalf("started %v after the submit, want 300ms or more", v.StartedAt.Sub(*v.CreatedAt))
	}
	a.settle()
	b.settle()
	if n := len(w.deliveries()); n != 1 {
		t.Fatalf("%d deliveries, want 1", n)
	}
}
