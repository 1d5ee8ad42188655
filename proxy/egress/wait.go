package egress

import (
	"context"
	"time"
)

// poolWait is the context a request waits in its target's pool queues
// with: the request's own (done when the listener shuts down), bounded by
// the target's timeout, which covers the whole exchange. pool.Acquire asks
// for Done only when it has to queue, so the deadline's timer is made only
// then and an admission that does not wait allocates nothing. It is used
// by one goroutine, the request's.
type poolWait struct {
	context.Context
	deadline time.Time
	bounded  context.Context
	cancel   context.CancelFunc
}

func (w *poolWait) Deadline() (time.Time, bool) { return w.deadline, true }

func (w *poolWait) Done() <-chan struct{} {
	if w.bounded == nil {
		w.bounded, w.cancel = context.WithDeadline(w.Context, w.deadline)
	}
	return w.bounded.Done()
}

func (w *poolWait) Err() error {
	if w.bounded == nil {
		return w.Context.Err()
	}
	return w.bounded.Err()
}

// end releases the timer, if one was made.
func (w *poolWait) end() {
	if w.cancel != nil {
		w.cancel()
	}
	*w = poolWait{}
}
