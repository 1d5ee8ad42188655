package scheduler

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// nextPurge moves the fake clock to the armed purge and waits until that
// purge has run and armed the next one; it returns when the purge ran.
func (h *harness) nextPurge() time.Time {
	h.t.Helper()
	var at int64
	h.waitUntil("a purge is armed", func(s *Scheduler) bool { at = s.purgeAt; return at != 0 })
	h.fake.Set(time.Unix(0, at))
	h.waitUntil("the purge ran", func(s *Scheduler) bool { return s.purgeAt > at })
	return time.Unix(0, at)
}

func (h *harness) gone(id string) bool {
	h.t.Helper()
	switch r := h.do("GET", "/"+id, ""); r.code {
	case http.StatusNotFound:
		return true
	case http.StatusOK:
		return false
	default:
		h.t.Fatalf("get %s: %d %s", id, r.code, r.body)
		return false
	}
}

// Finished runs are deleted once they ended longer ago than the
// retention; a run still running is kept however old, and a purged run's
// idempotency key makes a new run.
func TestRetentionPurgesFinishedRuns(t *testing.T) {
	w := newWorker(t, func(d delivery) (int, string) {
		if strings.Contains(d.body, "hold") {
			return http.StatusAccepted, ""
		}
		return http.StatusOK, `{"ok":true}`
	})
	h := newHarness(t, policyYAML(w.srv.URL, `
  store: { retention: 1h }
  definitions:
    job: {}`, ""), withFakeClock())
	early := h.submit(`{"name":"job","input":{},"idempotency_key":"early"}`).ID
	h.waitStatus(early, "COMPLETED")
	held := h.submit(`{"name":"job","input":"hold"}`).ID
	h.waitPhase(held, phaseAsync)

	h.fake.Advance(40 * time.Minute) // purges on the way find nothing an hour old
	late := h.submit(`{"name":"job","input":{}}`).ID
	h.waitStatus(late, "COMPLETED")
	if purgeInterval(time.Hour) != 150*time.Second {
		t.Fatalf("purge interval of 1h: %s", purgeInterval(time.Hour))
	}

	var earlyGone, lateGone time.Time
	for (earlyGone.IsZero() || lateGone.IsZero()) && h.fake.Now().Before(t0.Add(3*time.Hour)) {
		at := h.nextPurge()
		if earlyGone.IsZero() && h.gone(early) {
			earlyGone = at
		}
		if lateGone.IsZero() && h.gone(late) {
			lateGone = at
		}
		if h.gone(held) {
			t.Fatalf("the running run was purged at %s", at.Sub(t0))
		}
	}
	// Each went at the first purge more than an hour after it ended.
	if d := earlyGone.Sub(t0); d <= time.Hour || d > time.Hour+purgeInterval(time.Hour) {
		t.Errorf("run finished at 0 purged at %s", d)
	}
	if d := lateGone.Sub(t0); d <= 100*time.Minute || d > 100*time.Minute+purgeInterval(time.Hour) {
		t.Errorf("run finished at 40m purged at %s", d)
	}
	if v := value(h.m.RunsPurged.WithLabelValues("COMPLETED")); v != 2 {
		t.Errorf("warden_runs_purged_total{status=COMPLETED} = %v, want 2", v)
	}
	if v := value(h.m.Runs.WithLabelValues("COMPLETED")); v != 0 {
		t.Errorf("warden_runs{status=COMPLETED} = %v after the purge, want 0", v)
	}
	if v := value(h.m.Runs.WithLabelValues("RUNNING")); v != 1 {
		t.Errorf("warden_runs{status=RUNNING} = %v, want 1", v)
	}
	again := h.submit(`{"name":"job","input":{},"idempotency_key":"early"}`)
	if again.ID == early {
		t.Fatalf("the purged run's idempotency key returned its id %s", early)
	}
	if r := h.do("POST", "/"+held+"/complete", `{"status":"COMPLETED"}`); r.code != http.StatusOK {
		t.Fatalf("complete the held run: %d %s", r.code, r.body)
	}
}

// A reload that sets retention to 0 stops purging; setting it again
// starts.
func TestRetentionReload(t *testing.T) {
	w := newWorker(t, nil)
	sched := func(store string) string {
		return policyYAML(w.srv.URL, store+`
  definitions:
    job: {}`, "")
	}
	h := newHarness(t, sched(""), withFakeClock())
	armed := func() bool {
		h.sched.mu.Lock()
		defer h.sched.mu.Unlock()
		return h.sched.purgeT != nil
	}
	if armed() {
		t.Fatal("a purge is armed without retention")
	}
	if err := h.reload(sched("  store: { retention: 24h }")); err != nil {
		t.Fatal(err)
	}
	if !armed() {
		t.Fatal("no purge armed after the reload set retention")
	}
	h.nextPurge()
	if err := h.reload(sched("  store: { retention: 0s }")); err != nil {
		t.Fatal(err)
	}
	if armed() {
		t.Fatal("a purge is still armed after the reload set retention to 0")
	}
}
