package egress

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/internal/rawio"
)

// ClientCheckInterval is how often a request waiting in a pool's queue
// looks whether its client is still there.
const ClientCheckInterval = 100 * time.Millisecond

// StatusClientGone is the code warden_requests_total records for a request
// whose client hung up while it waited in a pool (nginx's 499): nothing was
// sent to the upstream and nothing could be answered.
const StatusClientGone = 499

// errClientGone ends a wait whose client hung up.
var errClientGone = errors.New("the client closed its connection while its request waited in a pool")

// poolWait is the context a request waits in its target's pool queues
// with: the request's own (done when the listener shuts down), bounded by
// the target's timeout (which covers the whole exchange) when it has one,
// and ended early when the client hangs up. pool.Acquire asks for Done
// only when it has to queue, so the timer and the client check are made
// only then and an admission that does not wait allocates nothing. It is
// used by one goroutine, the request's.
type poolWait struct {
	context.Context
	deadline time.Time // zero: none
	conn     net.Conn  // the client's connection
	clk      clock.Clock
	bounded  context.Context
	cancel   context.CancelCauseFunc
	unbound  context.CancelFunc // the deadline's, when there is one
	watch    *clientWatch
}

func (w *poolWait) Deadline() (time.Time, bool) { return w.deadline, !w.deadline.IsZero() }

func (w *poolWait) Done() <-chan struct{} {
	if w.bounded == nil {
		// Not derived from the RequestCtx itself: the deadline's timer
		// goroutine would read it (Value, when unlinking from its parent)
		// possibly after fasthttp recycled it for the next request.
		var parent context.Context = doneOnly{w.Context.Done()}
		if !w.deadline.IsZero() {
			parent, w.unbound = context.WithDeadline(parent, w.deadline)
		}
		w.bounded, w.cancel = context.WithCancelCause(parent)
		if w.conn != nil {
			w.watch = watchClient(w.clk, w.conn, w.cancel)
		}
	}
	return w.bounded.Done()
}

func (w *poolWait) Err() error {
	if w.bounded == nil {
		return w.Context.Err()
	}
	return w.bounded.Err()
}

// clientGone reports whether the wait ended because the client hung up.
func (w *poolWait) clientGone() bool {
	return w.bounded != nil && context.Cause(w.bounded) == errClientGone
}

// end stops the client check and releases the timer, if they were made.
func (w *poolWait) end() {
	if w.watch != nil {
		w.watch.stop()
	}
	if w.cancel != nil {
		w.cancel(context.Canceled)
	}
	if w.unbound != nil {
		w.unbound()
	}
	*w = poolWait{}
}

// clientWatch peeks at a waiting request's client connection every
// ClientCheckInterval: fasthttp reads nothing from it while the handler
// runs, so nothing else would notice the client leave.
type clientWatch struct {
	conn   net.Conn
	cancel context.CancelCauseFunc
	// mu orders the timer's arming, re-arming and stopping: the first
	// check may run before watchClient has stored the timer.
	mu      sync.Mutex
	t       clock.Timer
	stopped bool
}

func watchClient(clk clock.Clock, conn net.Conn, cancel context.CancelCauseFunc) *clientWatch {
	cw := &clientWatch{conn: conn, cancel: cancel}
	cw.mu.Lock()
	cw.t = clk.AfterFunc(ClientCheckInterval, cw.check)
	cw.mu.Unlock()
	return cw
}

func (cw *clientWatch) check() {
	if rawio.Peek(cw.conn) == rawio.PeekClosed {
		cw.cancel(errClientGone)
		return
	}
	cw.mu.Lock()
	if !cw.stopped {
		cw.t.Reset(ClientCheckInterval)
	}
	cw.mu.Unlock()
}

func (cw *clientWatch) stop() {
	cw.mu.Lock()
	cw.stopped = true
	cw.t.Stop()
	cw.mu.Unlock()
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
