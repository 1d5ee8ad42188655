package scheduler

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-dev/warden/scheduler/store"
)

// outage is a memory store whose status writes fail while it is down, as
// a Postgres store's do while the server restarts.
type outage struct {
	*store.Memory
	down    atomic.Bool
	refused chan store.Status // each write refused, by the status it carried
}

func (o *outage) Update(ctx context.Context, r *store.Run, from store.Statuses) error {
	if o.down.Load() {
		select {
		case o.refused <- r.Status:
		default:
		}
		return errors.New("store down")
	}
	return o.Memory.Update(ctx, r, from)
}

// A run's next record written while the store is down is not dropped: the
// API shows what it will be, the write is tried again until the store is
// back, and the run then goes on from there. Left behind, the stored run
// stayed STARTING under the sidecar's renewed lease for ever, holding its
// lane for the whole fleet, and a restart delivered finished work again.
func TestRecordWrittenAfterStoreOutage(t *testing.T) {
	cases := []struct {
		name   string
		def    string
		answer []int // the worker's answers, one per delivery
		// during runs while the store is down, after the first delivery's
		// answer; it returns the status the API must show meanwhile.
		during func(t *testing.T, h *harness, o *outage, id string) string
		want   string
		// after runs once the record has landed.
		after func(t *testing.T, h *harness, w *worker, id string)
	}{
		{name: "worker's 200", def: `job: {}`, answer: []int{200},
			during: func(t *testing.T, h *harness, o *outage, id string) string {
				if st := recv(t, o.refused, "the refused write"); st != store.Completed {
					t.Fatalf("refused write of %v", st)
				}
				return "COMPLETED"
			}, want: "COMPLETED"},
		{name: "worker's 500, retried", def: `job: { retry: { count: 1, delay: 1s, jitter: 0 } }`, answer: []int{500, 200},
			during: func(t *testing.T, h *harness, o *outage, id string) string {
				if st := recv(t, o.refused, "the refused write"); st != store.RetryWait {
					t.Fatalf("refused write of %v", st)
				}
				return "RETRY_WAIT"
			}, want: "RETRY_WAIT",
			after: func(t *testing.T, h *harness, w *worker, id string) {
				// The delay counts from the failure: 100ms of it went by
				// waiting for the store.
				h.waitUntil("the retry timer is armed", func(s *Scheduler) bool { return s.waits[mustSeq(id)] != nil })
				h.fake.Advance(time.Second - rewriteFirst)
				if d := w.next(t); d.attempt != "2" {
					t.Fatalf("retry carries attempt %s", d.attempt)
				}
				h.waitStatus(id, "COMPLETED")
			}},
		{name: "worker's 202, then complete", def: `job: {}`, answer: []int{202},
			during: func(t *testing.T, h *harness, o *outage, id string) string {
				if st := recv(t, o.refused, "the refused write"); st != store.Running {
					t.Fatalf("refused write of %v", st)
				}
				r := h.do("POST", "/"+id+"/complete", `{"status":"COMPLETED","output":{"n":1}}`)
				if r.code != 200 {
					t.Fatalf("complete while the store is down: %d %s", r.code, r.body)
				}
				if v := r.run(t); v.Status != "COMPLETED" {
					t.Fatalf("complete answered %s", v.Status)
				}
				return "COMPLETED"
			}, want: "COMPLETED"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := &outage{Memory: store.NewMemory(), refused: make(chan store.Status, 8)}
			defer o.Close()
			var n atomic.Int32
			w := newWorker(t, func(delivery) (int, string) {
				i := int(n.Add(1)) - 1
				if i == 0 {
					o.down.Store(true) // the store goes down while the worker works
				}
				return tc.answer[min(i, len(tc.answer)-1)], `{"ok":true}`
			})
			h := newHarness(t, policyYAML(w.srv.URL, "  definitions:\n    "+tc.def, ""), withStore(o), withFakeClock())
			id := h.submit(`{"name":"job"}`).ID
			w.next(t)
			show := tc.during(t, h, o, id)
			if v := h.get(id); v.Status != show {
				t.Fatalf("while the store is down the API shows %s, want %s", v.Status, show)
			}
			if r, _ := o.Memory.Get(context.Background(), mustSeq(id)); r.Status != store.Starting {
				t.Fatalf("stored %v while down", r.Status)
			}
			o.down.Store(false)
			h.fake.Advance(rewriteFirst)
			h.waitUntil("the write landed", func(s *Scheduler) bool { return s.pending[mustSeq(id)] == nil })
			if r, _ := o.Memory.Get(context.Background(), mustSeq(id)); apiStatus(r.Status) != tc.want {
				t.Fatalf("stored %v after the outage, want %s", r.Status, tc.want)
			}
			if tc.after != nil {
				tc.after(t, h, w, id)
			}
		})
	}
}

// A schedule_to_start timeout the store refuses is written once it is
// back; it was dropped, leaving the run QUEUED in the store but out of
// the queue until a restart.
func TestTimeoutWrittenAfterStoreOutage(t *testing.T) {
	o := &outage{Memory: store.NewMemory(), refused: make(chan store.Status, 8)}
	defer o.Close()
	g := newGates()
	w := newGatedWorker(t, g)
	h := newHarness(t, policyYAML(w.srv.URL, `
  lanes: 1
  definitions:
    job: { schedule_to_start_timeout: 30s }`, ""), withStore(o), withFakeClock())
	first := h.submit(`{"name":"job"}`)
	w.next(t)
	second := h.submit(`{"name":"job"}`)
	o.down.Store(true)
	h.fake.Advance(30 * time.Second)
	if st := recv(t, o.refused, "the refused write"); st != store.TimedOut {
		t.Fatalf("refused write of %v", st)
	}
	if v := h.get(second.ID); v.Status != "TIMED_OUT" {
		t.Fatalf("while the store is down the API shows %s, want TIMED_OUT", v.Status)
	}
	o.down.Store(false)
	h.fake.Advance(rewriteFirst)
	h.waitUntil("the write landed", func(s *Scheduler) bool { return s.pending[mustSeq(second.ID)] == nil })
	if r, _ := o.Memory.Get(context.Background(), mustSeq(second.ID)); r.Status != store.TimedOut {
		t.Fatalf("stored %v after the outage, want TIMED_OUT", r.Status)
	}
	g.release(first.ID)
	h.waitStatus(first.ID, "COMPLETED")
}
