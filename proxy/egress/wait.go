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
		// Not derived from the RequestCtx itself: the deadline's timer
		// goroutine would read it (Value, when unlinking from its parent)
		// possibly after fasthttp recycled it for the next request.
		w.bounded, w.cancel = context.WithDeadline(doneOnly{w.Context.Done()}, w.deadline)
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

// doneOnly is a context that ends when done closes (the listener's
// shutdown) and carries nothing else.
type doneOnly struct{ done <-chan struct{} }

func (d doneOnly) Deadline() (time.Time, bool) { return time.Time{}, false }
func (d doneOnly) Done() <-chan struct{}       { return d.done }
func (d doneOnly) Value(any) any               { return nil }

func (d doneOnly) Err() error {
	select {
	case <-d.done:
		return context.Canceled
	default:
		return nil
	}
}
