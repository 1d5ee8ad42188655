package scheduler

import (
	"context"
	"sync"
)

// runWatch tells others when a run ends: the bridge governor closes the
// database sessions of a run (application_name=run:<id>) once it reaches a
// final state.
type runWatch struct {
	mu sync.Mutex
	m  map[uint64]chan struct{}
}

var closedCh = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Done implements the bridge's RunTracker: the channel is closed once the
// run reaches a final state (already closed when it has); known is false
// for an id that names no run.
func (s *Scheduler) Done(id string) (<-chan struct{}, bool) {
	seq, ok := s.parseID(id)
	if !ok {
		return nil, false
	}
	s.mu.Lock()
	st := s.st
	s.mu.Unlock()
	if st == nil {
		return nil, false
	}
	r, err := st.Get(context.Background(), seq)
	if err != nil {
		return nil, false
	}
	if r.Status.Terminal() {
		return closedCh, true
	}
	s.watch.mu.Lock()
	if s.watch.m == nil {
		s.watch.m = map[uint64]chan struct{}{}
	}
	ch, ok := s.watch.m[seq]
	if !ok {
		ch = make(chan struct{})
		s.watch.m[seq] = ch
	}
	s.watch.mu.Unlock()
	// The run may have ended between the read and the registration: look
	// again now that an end would close the channel.
	if r, err := st.Get(context.Background(), seq); err == nil && r.Status.Terminal() {
		s.ended(seq)
	}
	return ch, true
}

// ended closes the watchers of a run that reached a final state.
func (s *Scheduler) ended(seq uint64) {
	s.watch.mu.Lock()
	ch, ok := s.watch.m[seq]
	delete(s.watch.m, seq)
	s.watch.mu.Unlock()
	if ok {
		close(ch)
	}
}
