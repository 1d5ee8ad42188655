package scheduler

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// cancel cancels id with body and checks the answer: 200 with the run
// CANCELLED, control "cancelled" and wantReason.
func (h *harness) cancel(id, body, wantReason string) RunView {
	h.t.Helper()
	r := h.do("POST", "/"+id+"/cancel", body)
	if r.code != http.StatusOK {
		h.t.Fatalf("cancel %s: %d %s", id, r.code, r.body)
	}
	v := r.run(h.t)
	if v.Status != "CANCELLED" || deref(v.Control) != ControlCancelled || deref(v.ReasonForIncompletion) != wantReason || v.FinishedAt == nil {
		h.t.Fatalf("cancelled run: status %s control %s reason %q finished_at %v", v.Status, deref(v.Control), deref(v.ReasonForIncompletion), v.FinishedAt)
	}
	if g := h.get(id); g.Status != "CANCELLED" {
		h.t.Fatalf("GET after the cancel: %s", g.Status)
	}
	return v
}

// A waiting run leaves the queue: it is never delivered, its bridge
// watchers are told, and the run behind it takes its place.
func TestCancelQueuedRun(t *testing.T) {
	g := newGates()
	w := newGatedWorker(t, g)
	h := newHarness(t, policyYAML(w.srv.URL, `
  lanes: 1
  definitions:
    job: {}`, ""))
	first := h.submit(`{"name":"job"}`).ID
	w.next(t)
	second := h.submit(`{"name":"job"}`).ID
	third := h.submit(`{"name":"job"}`).ID
	ended, known := h.sched.Done(second)
	if !known {
		t.Fatal("Done: the queued run is unknown")
	}
	h.cancel(second, `{"reason":"superseded by a newer sync"}`, "superseded by a newer sync")
	select {
	case <-ended:
	default:
		t.Fatal("the cancelled run's watchers (bridge sessions) were not told it ended")
	}
	g.release(first)
	if d := w.next(t); d.id != third {
		t.Fatalf("after the first run, %s was delivered, want %s", d.id, third)
	}
	g.release(third)
	h.waitStatus(third, "COMPLETED")
	for _, d := range w.deliveries() {
		if d.id == second {
			t.Fatal("the cancelled run reached the worker")
		}
	}
	if v := value(h.m.Runs.WithLabelValues("CANCELLED")); v != 1 {
		t.Errorf("warden_runs{status=CANCELLED} = %v", v)
	}
	if v := value(h.m.Runs.WithLabelValues("QUEUED")); v != 0 {
		t.Errorf("warden_runs{status=QUEUED} = %v", v)
	}
}

// A run being delivered has its request aborted and frees its lane at
// once; a run the worker accepted (202) ends here and the worker learns it
// at its next heartbeat or complete.
func TestCancelRunningRun(t *testing.T) {
	aborted := make(chan string, 4)
	w := newWorker(t, nil)
	w.srv.Config.Handler = http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("x-run-id")
		io.Copy(io.Discard, r.Body) // net/http watches for the client going away once the body is read
		w.arrived <- delivery{id: id}
		if r.Header.Get("x-run-attempt") != "" && mustSeq(id) == 1 {
			<-r.Context().Done() // hold the delivery until warden drops it
			aborted <- id
			return
		}
		rw.WriteHeader(http.StatusAccepted)
	})
	h := newHarness(t, policyYAML(w.srv.URL, `
  lanes: 1
  definitions:
    job: {}`, ""))
	sync := h.submit(`{"name":"job"}`).ID
	if d := w.next(t); d.id != sync || mustSeq(sync) != 1 {
		t.Fatalf("delivered %s, want run 1", d.id)
	}
	next := h.submit(`{"name":"job"}`).ID
	h.cancel(sync, "", "cancelled through the API")
	if id := recv(t, aborted, "the cancelled delivery's abort"); id != sync {
		t.Fatalf("aborted %s", id)
	}
	if d := w.next(t); d.id != next {
		t.Fatalf("the freed lane went to %s, want %s", d.id, next)
	}
	h.waitPhase(next, phaseAsync)
	h.cancel(next, `{"reason":"operator"}`, "operator")
	for _, op := range []string{"heartbeat", "complete"} {
		body := ""
		if op == "complete" {
			body = `{"status":"COMPLETED"}`
		}
		r := h.do("POST", "/"+next+"/"+op, body)
		if r.code != http.StatusConflict || !strings.Contains(string(r.body), "CANCELLED") {
			t.Fatalf("%s after the cancel: %d %s, want 409 naming CANCELLED", op, r.code, r.body)
		}
	}
	if v := value(h.m.Runs.WithLabelValues("RUNNING")); v != 0 {
		t.Errorf("warden_runs{status=RUNNING} = %v", v)
	}
}

// A run waiting to be retried is not retried.
func TestCancelRetryWait(t *testing.T) {
	w := newWorker(t, func(delivery) (int, string) { return http.StatusServiceUnavailable, "busy" })
	h := newHarness(t, policyYAML(w.srv.URL, `
  definitions:
    job: { retry: { count: 3, delay: 1h, jitter: 0 } }`, ""), withFakeClock())
	id := h.submit(`{"name":"job"}`).ID
	h.waitStatus(id, "RETRY_WAIT")
	h.waitUntil("the retry timer is armed", func(s *Scheduler) bool { return s.waits[mustSeq(id)] != nil })
	h.cancel(id, "", "cancelled through the API")
	h.fake.Advance(2 * time.Hour)
	h.settle()
	if n := len(w.deliveries()); n != 1 {
		t.Fatalf("%d deliveries, want the first only", n)
	}
	if v := h.get(id); v.Status != "CANCELLED" || v.RetryAt != nil {
		t.Fatalf("after the retry delay: %s retry_at %v", v.Status, v.RetryAt)
	}
}

func TestCancelRefusals(t *testing.T) {
	w := newWorker(t, nil)
	h := newHarness(t, policyYAML(w.srv.URL, `
  definitions:
    job: {}`, ""))
	done := h.submit(`{"name":"job"}`).ID
	h.waitStatus(done, "COMPLETED")
	tests := []struct {
		name, path, method, body string
		code                     int
		want                     string
	}{
		{"finished", "/" + done + "/cancel", "POST", "", http.StatusConflict, "already COMPLETED"},
		{"unknown", "/999/cancel", "POST", "", http.StatusNotFound, "not found"},
		{"not an id", "/x/cancel", "POST", "", http.StatusNotFound, "not found"},
		{"bad body", "/" + done + "/cancel", "POST", `{"why":"x"}`, http.StatusBadRequest, `(fields: reason)`},
		{"GET", "/" + done + "/cancel", "GET", "", http.StatusMethodNotAllowed, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := h.do(tt.method, tt.path, tt.body)
			if r.code != tt.code || !strings.Contains(string(r.body), tt.want) {
				t.Fatalf("%d %s, want %d with %q", r.code, r.body, tt.code, tt.want)
			}
		})
	}
	if v := h.get(done); v.Status != "COMPLETED" {
		t.Fatalf("a refused cancel changed the run: %s", v.Status)
	}
}

// On a shared queue any sidecar cancels a waiting run; a run being
// delivered is cancelled through the sidecar delivering it.
func TestSharedStoreCancel(t *testing.T) {
	db := newSharedDB(t)
	g := newGates()
	w := newGatedWorker(t, g)
	sched := `
  lanes: 1
  definitions:
    job: {}`
	a := newSidecar(t, db, w, sched, 2*time.Second)
	b := newSidecar(t, db, w, sched, 2*time.Second)
	running := a.submit(`{"name":"job"}`).ID
	if d := w.next(t); d.id != running {
		t.Fatalf("delivered %s, want %s", d.id, running)
	}
	waiting := a.submit(`{"name":"job"}`).ID
	// Either sidecar may have claimed it.
	owner, other := a, b
	b.sched.mu.Lock()
	if b.sched.active[mustSeq(running)] != nil {
		owner, other = b, a
	}
	b.sched.mu.Unlock()
	r := other.do("POST", "/"+running+"/cancel", "")
	if r.code != http.StatusConflict || !strings.Contains(string(r.body), "through the sidecar that delivered it") {
		t.Fatalf("cancel through another sidecar: %d %s, want 409", r.code, r.body)
	}
	other.cancel(waiting, "", "cancelled through the API")
	owner.cancel(running, "", "cancelled through the API")
	if n := db.count(t, "status = 9"); n != 2 {
		t.Fatalf("%d runs CANCELLED in the store, want 2", n)
	}
	g.openAll()
	owner.settle()
	if n := len(w.deliveries()); n != 1 {
		t.Fatalf("%d deliveries, want 1: the cancelled waiting run was delivered", n)
	}
}

// Cancels racing admissions, deliveries, retries and completions: every
// run ends once, a cancel that answered CANCELLED stays so, lanes and keys
// hold, and warden_runs adds up.
func TestCancelUnderLoad(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts func(t *testing.T) []harnessOpt
	}{
		{"memory", func(*testing.T) []harnessOpt { return nil }},
		{"bbolt", func(t *testing.T) []harnessOpt { return []harnessOpt{withDataDir(t.TempDir())} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var n atomic.Int64
			w := newWorker(t, func(delivery) (int, string) {
				if n.Add(1)%4 == 0 {
					return http.StatusServiceUnavailable, "busy"
				}
				time.Sleep(2 * time.Millisecond) // the worker's work, for cancels to land during
				return http.StatusOK, "{}"
			})
			h := newHarness(t, policyYAML(w.srv.URL, `
  lanes: 3
  definitions:
    job: { key: "${input.k}", key_concurrency: 1, retry: { count: 2, delay: 20ms, jitter: 0 } }`, ""), tc.opts(t)...)
			const runs = 240
			ids := make([]string, runs)
			cancelled := make([]bool, runs)
			toCancel := make(chan int, runs)
			var wg sync.WaitGroup
			for range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range toCancel {
						r := h.do("POST", "/"+ids[i]+"/cancel", "")
						switch {
						case r.code == http.StatusOK:
							cancelled[i] = true
						case r.code == http.StatusConflict && strings.Contains(string(r.body), "already"):
						default:
							t.Errorf("cancel %s: %d %s", ids[i], r.code, r.body)
						}
					}
				}()
			}
			// The scheduler's own count of admitted runs, sampled: the
			// worker may still be finishing a delivery a cancel aborted
			// (as after a start_to_close timeout), so its count may not.
			var most atomic.Int64
			stop := make(chan struct{})
			sampled := make(chan struct{})
			go func() {
				defer close(sampled)
				for {
					h.sched.mu.Lock()
					running := int64(h.sched.running)
					h.sched.mu.Unlock()
					if running > most.Load() {
						most.Store(running)
					}
					select {
					case <-stop:
						return
					case <-time.After(50 * time.Microsecond):
					}
				}
			}()
			for i := range ids {
				ids[i] = h.submit(fmt.Sprintf(`{"name":"job","input":{"k":%d}}`, i%7)).ID
				if i%2 == 0 { // half the runs, cancelled from four callers while the rest run
					toCancel <- i
				}
			}
			close(toCancel)
			wg.Wait()
			ended := map[string]int{}
			for i, id := range ids {
				var v RunView
				for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
					if v = h.get(id); v.FinishedAt != nil {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("run %s never ended: %s", id, v.Status)
					}
				}
				ended[v.Status]++
				if cancelled[i] != (v.Status == "CANCELLED") {
					t.Errorf("run %s: cancel answered CANCELLED %v, ended %s", id, cancelled[i], v.Status)
				}
			}
			close(stop)
			<-sampled
			if m := most.Load(); m > 3 {
				t.Errorf("%d runs admitted at once with lanes 3", m)
			}
			h.settle()
			for _, st := range []string{"QUEUED", "RUNNING", "RETRY_WAIT", "COMPLETED", "FAILED", "CANCELLED"} {
				if v := value(h.m.Runs.WithLabelValues(st)); int(v) != ended[st] {
					t.Errorf("warden_runs{status=%s} = %v, want %d", st, v, ended[st])
				}
			}
			if ended["CANCELLED"] == 0 || ended["COMPLETED"] == 0 {
				t.Errorf("ended %v: the cancels raced nothing", ended)
			}
			t.Logf("ended: %v", ended)
		})
	}
}
