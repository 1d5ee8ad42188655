package scheduler

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/warden-dev/warden/scheduler/store"
)

// lostStarts is a memory store whose next STARTING write is queued and
// then, when the test says so, reported failed — as the bbolt committer
// would report a broken disk after the delivery began.
type lostStarts struct {
	*store.Memory
	mu      sync.Mutex
	failing bool
	pending chan func(error)
}

func (l *lostStarts) StartAsync(ctx context.Context, seq uint64, a store.Admission, done func(error)) (store.Run, error) {
	l.mu.Lock()
	fail := l.failing
	l.failing = false
	l.mu.Unlock()
	if !fail {
		r, err := l.Start(ctx, seq, a)
		if err == nil {
			done(nil)
		}
		return r, err
	}
	r, err := l.Get(ctx, seq)
	if err != nil {
		return store.Run{}, err
	}
	r.Status, r.Attempt, r.StartedAt = store.Starting, r.Attempt+1, a.At // as it would have been written
	l.pending <- done
	return r, nil
}

// A delivery whose STARTING write fails after it began is abandoned and
// the run, QUEUED as far as the store knows, waits again: it is delivered
// once more with the same attempt and completes; nothing is lost.
func TestLostStartingWriteRequeuesTheRun(t *testing.T) {
	st := &lostStarts{Memory: store.NewMemory(), failing: true, pending: make(chan func(error), 1)}
	defer st.Close()
	g := newGates()
	var mu sync.Mutex
	seen := map[string]int{}
	w := newWorker(t, func(d delivery) (int, string) {
		mu.Lock()
		seen[d.id]++
		first := seen[d.id] == 1
		mu.Unlock()
		if first {
			g.wait(d.id)
		}
		return 200, "{}"
	}, g)
	h := newHarness(t, policyYAML(w.srv.URL, "  lanes: 1\n  definitions:\n    job: {}", ""), withStore(st))
	// The first run is admitted as it is submitted (no StartAsync); the
	// second waits for its lane and is started through the store's queue.
	holder := h.submit(`{"name":"job"}`)
	w.next(t)
	run := h.submit(`{"name":"job"}`)
	g.release(holder.ID)
	if d := w.next(t); d.id != run.ID || d.attempt != "1" {
		t.Fatalf("first delivery %s attempt %s", d.id, d.attempt)
	}
	(<-st.pending)(errors.New("disk on fire"))
	// The failure is handled on its own goroutine: wait for the run to be
	// back in the queue before the worker answers the abandoned delivery,
	// or that answer could complete the run first (a flake seen once in CI).
	h.waitUntil("the run back in the queue", func(s *Scheduler) bool { return s.running == 0 })
	g.release(run.ID)
	// As after any failed admission write, the next event (here a
	// submission) retries, rather than a pass that would spin on a broken
	// store.
	next := h.submit(`{"name":"job"}`)
	if d := w.next(t); d.id != run.ID || d.attempt != "1" {
		t.Fatalf("after the lost write: delivery %s attempt %s, want %s again with attempt 1", d.id, d.attempt, run.ID)
	}
	if v := h.waitStatus(run.ID, "COMPLETED"); v.Attempt != 1 {
		t.Fatalf("completed with attempt %d", v.Attempt)
	}
	g.release(next.ID)
	h.waitStatus(next.ID, "COMPLETED")
	if n := len(w.deliveries()); n != 4 {
		t.Fatalf("%d deliveries, want 4 (the holder, the lost start, the redelivery, the next run)", n)
	}
}
