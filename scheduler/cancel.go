package scheduler

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/warden-dev/warden/governor/control"
	"github.com/warden-dev/warden/scheduler/store"
)

// ControlCancelled names what ended a cancelled run.
const ControlCancelled = string(control.Cancelled)

// cancelTries bounds how often Cancel looks again after losing a race
// with another transition of the run (an admission, a retry wait ending).
// Every lost race is the run moving on, and a loaded machine (a group
// commit's fsync, goroutines waiting for a core) can take milliseconds per
// move: with pause's backoff the tries span about 2.6 s before Cancel gives
// up with "try again".
const cancelTries = 32

// Cancel ends a run that has not finished: CANCELLED, control "cancelled",
// reason as given. A waiting run leaves the queue; a run in RETRY_WAIT is
// not retried and a SCHEDULED one never starts; a run being delivered has
// its request to the worker aborted, and one the worker accepted (202) is
// ended here: the worker's next heartbeat or complete gets 409 naming
// CANCELLED. Its lane, key, pool slot and permits are freed at once and
// its bridge sessions closed. A finished run is a Conflict. With a shared
// store, a run another sidecar is delivering must be cancelled through
// that sidecar.
func (s *Scheduler) Cancel(ctx context.Context, id, reason string) (RunView, error) {
	seq, err := s.enterID(id)
	if err != nil {
		return RunView{}, err
	}
	defer s.leave()
	if reason == "" {
		reason = "cancelled through the API"
	}
	for try := range cancelTries {
		done, err := s.cancelOnce(ctx, seq, reason, try)
		if err != nil {
			return RunView{}, err
		}
		if done {
			return s.view(ctx, seq)
		}
	}
	v, err := s.view(ctx, seq)
	if err == nil {
		err = &Conflict{Msg: fmt.Sprintf("run %s kept changing state (now %s); try again", id, v.Status)}
	}
	return v, err
}

// cancelOnce tries to cancel seq where it is now. done false: the run
// moved meanwhile, look again.
func (s *Scheduler) cancelOnce(ctx context.Context, seq uint64, reason string, try int) (bool, error) {
	s.mu.Lock()
	if a := s.active[seq]; a != nil {
		s.mu.Unlock()
		if a.getPhase() == phaseAdmitted {
			// Its STARTING record is being written, within a group
			// commit: once written it is delivering (and cancelled
			// below), if the write fails it is queued again.
			return false, pause(ctx, try)
		}
		if s.finish(a, store.Cancelled, nil, reason, ControlCancelled) {
			return true, nil
		}
		// Ended or left for a retry wait meanwhile; the loop lets it go.
		return false, pause(ctx, try)
	}
	var from store.Status
	waited := false
	if t, ok := s.waits[seq]; ok {
		t.Stop()
		delete(s.waits, seq)
		waited = true // RETRY_WAIT or SCHEDULED: the store says which
	} else if h, ok := s.q.find(seq); ok {
		e := s.q.remove(h)
		if cfg := s.cfgPtr.Load(); cfg != nil {
			if d := cfg.defs[e.g.q.name]; d != nil {
				s.armSTSLocked(d)
			}
		}
		from = store.Queued
	}
	s.mu.Unlock()
	r, err := s.st.Get(ctx, seq)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return false, ErrNotFound
	case err != nil:
		return false, fmt.Errorf("load run: %w", err)
	case r.Status.Terminal():
		return false, &Conflict{Msg: fmt.Sprintf("run %s is already %s", s.formatID(seq), r.Status)}
	case r.Status == store.Starting || r.Status == store.Running:
		if err := s.adm.heldElsewhere(s.formatID(seq), "cancel"); err != nil {
			return false, err
		}
		// Admitted by this sidecar since the look above.
		return false, pause(ctx, try)
	}
	if from == 0 && (!waited || r.Status == store.RetryWait || r.Status == store.Scheduled) {
		// Taken from a wait (the store says which), or not in this
		// sidecar's index at all: a shared store's queue, a wait a drain
		// left without its timer, or a run between its store write and
		// the index.
		from = r.Status
	}
	if r.Status != from {
		// Moved on between the index and the read: a wait whose requeue
		// is under way (it queues the run itself).
		return false, nil
	}
	r.Status, r.FinishedAt, r.Reason, r.Control = store.Cancelled, s.clk.Now().UnixNano(), reason, ControlCancelled
	r.RetryAt = 0
	if err := s.st.Update(ctx, &r, store.Of(from)); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return false, nil // admitted, requeued or ended meanwhile
		}
		s.restore(from, r.Seq)
		return false, fmt.Errorf("record the cancellation: %w", err)
	}
	s.moved(from, store.Cancelled)
	s.ended(seq)
	return true, nil
}

// restore puts a run Cancel took out of the queue or its retry wait back
// where the store says it is, when the cancellation did not happen.
func (s *Scheduler) restore(from store.Status, seq uint64) {
	r, err := s.st.Get(context.Background(), seq)
	if err != nil || r.Status != from {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch from {
	case store.Queued:
		if _, queued := s.q.find(seq); !queued && s.active[seq] == nil {
			s.adm.enqueueLocked(&r)
		}
	case store.RetryWait, store.Scheduled:
		if _, waiting := s.waits[seq]; !waiting {
			s.armRetryLocked(seq, r.RetryAt)
		}
	}
}

// pause lets a transition in progress land before Cancel looks again: a
// STARTING write is one group commit. It waits 1 ms on the first try,
// twice as long on each next one, at most 100 ms.
func pause(ctx context.Context, try int) error {
	t := time.NewTimer(min(time.Millisecond<<min(try, 7), 100*time.Millisecond))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
