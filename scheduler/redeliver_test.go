package scheduler

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/warden-dev/warden/scheduler/store"
	"github.com/warden-dev/warden/scheduler/store/pgstore"
)

// A run delivered again shows no failure reason while it runs: the reason
// of the attempt that failed (a worker's 503, a sidecar that stopped
// renewing its lease) is what RETRY_WAIT and QUEUED report, and the next
// admission clears it, in every store and on both admission paths of a
// shared one (a claim, and a sweep of an expired lease before it).
func TestRedeliveredRunHasNoReason(t *testing.T) {
	sched := `
  lanes: 5
  definitions:
    job: { retry: { count: 1, delay: 0s } }`
	// The first attempt fails (503); the next is accepted (202) and runs.
	respond := func(d delivery) (int, string) {
		if d.attempt == "1" {
			return http.StatusServiceUnavailable, "busy"
		}
		return http.StatusAccepted, ""
	}
	submit := func(h *harness) string { return h.submit(`{"name":"job"}`).ID }
	tests := []struct {
		name  string
		start func(t *testing.T, w *worker) (*harness, string)
	}{
		{"retried, memory store", func(t *testing.T, w *worker) (*harness, string) {
			h := newHarness(t, policyYAML(w.srv.URL, sched, ""))
			return h, submit(h)
		}},
		{"retried, bbolt store", func(t *testing.T, w *worker) (*harness, string) {
			h := newHarness(t, policyYAML(w.srv.URL, sched, ""), withDataDir(t.TempDir()))
			return h, submit(h)
		}},
		{"retried, postgres store", func(t *testing.T, w *worker) (*harness, string) {
			h := newSidecar(t, newSharedDB(t), w, sched, 2*time.Second)
			return h, submit(h)
		}},
		{"lease expired, postgres store", func(t *testing.T, w *worker) (*harness, string) {
			// A sidecar that is gone claimed the run and its worker
			// accepted it; its lease has ended. The live sidecar's sweep
			// queues the run again (reason: the lease) and delivers it.
			db := newSharedDB(t)
			st := db.open(t)
			defer st.Close()
			ctx := context.Background()
			now := time.Now().UnixNano()
			r := &store.Run{Name: "job", Status: store.Queued, Input: []byte(`{}`), CreatedAt: now, QueuedAt: now}
			if _, err := st.Submit(ctx, r); err != nil {
				t.Fatal(err)
			}
			res, err := st.Claim(ctx, pgstore.ClaimRequest{Owner: "gone", Now: now, Lease: time.Millisecond, Lanes: 5,
				Defs: map[string]pgstore.ClaimDef{"job": {}}})
			if err != nil || len(res.Runs) != 1 {
				t.Fatalf("claim for the gone sidecar: %v %v", res.Runs, err)
			}
			run := res.Runs[0]
			run.Status = store.Running
			if err := st.Update(ctx, &run, store.Of(store.Starting)); err != nil {
				t.Fatal(err)
			}
			return newSidecar(t, db, w, sched, 300*time.Millisecond), strconv.FormatUint(r.Seq, 10) // a shared store's ids are its sequence
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorker(t, respond)
			h, id := tc.start(t, w)
			for d := w.next(t); d.attempt != "2"; d = w.next(t) {
			}
			h.waitPhase(id, phaseAsync)
			if v := h.get(id); v.Status != "RUNNING" || v.Attempt != 2 || v.ReasonForIncompletion != nil {
				t.Fatalf("run delivered again: %s attempt %d reason %q, want RUNNING attempt 2 without a reason",
					v.Status, v.Attempt, deref(v.ReasonForIncompletion))
			}
			if r := h.do("POST", "/"+id+"/complete", `{"status":"COMPLETED"}`); r.code != http.StatusOK {
				t.Fatalf("complete: %d %s", r.code, r.body)
			}
		})
	}
}
