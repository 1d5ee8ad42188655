// Package clientwait is the context a proxied request waits with: in a
// pool's queue, for an upstream connection, for a retry's delay. It ends
// at the request's deadline or when the client hangs up, and never because
// the listener began to drain: a drain lets waiting requests finish, and
// the connections still open when its grace is over are closed, which
// ends their waits here too.
package clientwait

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/internal/rawio"
)

// CheckInterval is how often a waiting request looks whether its client is
// still there.
const CheckInterval = 100 * time.Millisecond

// StatusGone is the code warden_requests_total records for a request whose
// client hung up while it waited (nginx's 499): nothing was sent to the
// upstream and nothing could be answered.
const StatusGone = 499

// errGone ends a wait whose client hung up.
var errGone = errors.New("the client closed its connection while its request waited")

// Wait is a context.Context. Its timer and client check are made only
// when Done is first asked for, which callers do only when they have to
// wait, so a request that never waits allocates nothing. It is used by one
// goroutine, the request's; the zero Wait, or one after End, never ends.
type Wait struct {
	deadline time.Time // zero: none
	conn     net.Conn  // the client's connection
	clk      clock.Clock
	ctx      context.Context
	cancel   context.CancelCauseFunc
	unbound  context.CancelFunc // the deadline's, when there is one
	watch    *watch
}

// Reset makes w the wait of a request on conn (nil: not watched) that must
// be over by deadline (zero: none).
func (w *Wait) Reset(conn net.Conn, clk clock.Clock, deadline time.Time) {
	w.End()
	w.conn, w.clk, w.deadline = conn, clk, deadline
}

func (w *Wait) Deadline() (time.Time, bool) { return w.deadline, !w.deadline.IsZero() }

func (w *Wait) Done() <-chan struct{} {
	if w.ctx == nil {
		parent := context.Background()
		if !w.deadline.IsZero() {
			parent, w.unbound = context.WithDeadline(parent, w.deadline)
		}
		w.ctx, w.cancel = context.WithCancelCause(parent)
		if w.conn != nil && w.clk != nil {
			w.watch = watchClient(w.clk, w.conn, w.cancel)
		}
	}
	return w.ctx.Done()
}

func (w *Wait) Err() error {
	if w.ctx == nil {
		return nil
	}
	return w.ctx.Err()
}

func (w *Wait) Value(any) any { return nil }

// ClientGone reports whether the wait ended because the client hung up.
func (w *Wait) ClientGone() bool {
	return w.ctx != nil && context.Cause(w.ctx) == errGone
}

// End stops the client check and releases the timer, if they were made.
func (w *Wait) End() {
	if w.watch != nil {
		w.watch.stop()
	}
	if w.cancel != nil {
		w.cancel(context.Canceled)
	}
	if w.unbound != nil {
		w.unbound()
	}
	*w = Wait{}
}

// watch peeks at a waiting request's client connection every
// CheckInterval: fasthttp reads nothing from it while the handler runs,
// so nothing else would notice the client leave, or the drain close it.
type watch struct {
	conn   net.Conn
	cancel context.CancelCauseFunc
	// mu orders the timer's arming, re-arming and stopping: the first
	// check may run before watchClient has stored the timer.
	mu      sync.Mutex
	t       clock.Timer
	stopped bool
}

func watchClient(clk clock.Clock, conn net.Conn, cancel context.CancelCauseFunc) *watch {
	cw := &watch{conn: conn, cancel: cancel}
	cw.mu.Lock()
	cw.t = clk.AfterFunc(CheckInterval, cw.check)
	cw.mu.Unlock()
	return cw
}

func (cw *watch) check() {
	if rawio.Peek(cw.conn) == rawio.PeekClosed {
		cw.cancel(errGone)
		return
	}
	cw.mu.Lock()
	if !cw.stopped {
		cw.t.Reset(CheckInterval)
	}
	cw.mu.Unlock()
}

func (cw *watch) stop() {
	cw.mu.Lock()
	cw.stopped = true
	cw.t.Stop()
	cw.mu.Unlock()
}

// Context is w as a context other goroutines may watch (a dialer's): the
// wait begins, as Done begins it, and w.End still ends it.
func (w *Wait) Context() context.Context {
	w.Done()
	return w.ctx
}
