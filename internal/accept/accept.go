// Package accept keeps a listening socket accepting through the errors a
// busy process meets: out of file descriptors (EMFILE, ENFILE), of kernel
// buffers or memory (ENOBUFS, ENOMEM), a connection aborted while queued
// (ECONNABORTED). net/http's Serve retries such errors after a backoff;
// fasthttp's returns on the first one and never accepts again, leaving the
// socket in LISTEN with a growing backlog. A Listener retries them inside
// Accept, with net/http's backoff (5 ms, doubling, at most 1 s), so the
// server above never sees them, and says meanwhile why it is not accepting
// (Err), for readiness checks.
package accept

import (
	"errors"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/warden-dev/warden/governor/clock"
)

// Backoff bounds: net/http's.
const (
	minBackoff = 5 * time.Millisecond
	maxBackoff = time.Second
)

// Options describe a Listener.
type Options struct {
	Name   string       // names the listener in log lines
	Clock  clock.Clock  // times the backoff; nil: the real clock
	Log    *slog.Logger // nil: discarded
	Errors prometheus.Counter
}

// Listener is a listening socket whose Accept retries temporary errors.
// Close it rather than the socket under it: a backoff in progress ends at
// once.
type Listener struct {
	ln   net.Listener
	opts Options

	closed    chan struct{}
	closeOnce sync.Once
	closeErr  error

	mu      sync.Mutex
	failing error     // the burst in progress: its last error; nil while accepting
	failed  int       // failed accepts in the burst
	since   time.Time // when the burst began
}

// New wraps ln.
func New(ln net.Listener, opts Options) *Listener {
	if opts.Clock == nil {
		opts.Clock = clock.Real{}
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	return &Listener{ln: ln, opts: opts, closed: make(chan struct{})}
}

// Accept returns the next connection. A temporary error (Temporary) is
// logged once per burst, counted, and retried after a backoff; what is
// returned is a connection, the socket's error once it is closed, or an
// error that is not temporary.
//
// After a failure the socket is asked again under a deadline as long as
// the backoff (when it has SetDeadline, as a TCP listener does): if that
// passes with nothing to accept, the socket works and simply has no
// client, and the burst is over. Without it a listener that ran out of
// descriptors would look broken until the next client came, which for a
// listener a readiness check has taken out of service is never.
func (l *Listener) Accept() (net.Conn, error) {
	backoff := time.Duration(0)
	probing := false
	for {
		c, err := l.ln.Accept()
		if probing {
			probing = false
			l.setDeadline(time.Time{})
			if err != nil && isTimeout(err) && !l.isClosed() {
				l.recovered()
				continue
			}
		}
		if err == nil {
			l.recovered()
			return c, nil
		}
		if l.isClosed() || errors.Is(err, net.ErrClosed) || !Temporary(err) {
			return nil, err
		}
		l.fail(err)
		backoff = Backoff(backoff)
		if !l.wait(backoff) {
			continue // closed: the socket answers so at once
		}
		probing = l.setDeadline(time.Now().Add(backoff))
	}
}

// Backoff is the wait after one that was prev (0: the first): net/http's,
// 5 ms doubling to at most 1 s.
func Backoff(prev time.Duration) time.Duration { return min(max(2*prev, minBackoff), maxBackoff) }

// Temporary reports whether an accept error passes by itself: the process
// or the system out of descriptors, buffers or memory, a connection that
// was aborted in the queue, or any error that says it is temporary.
func Temporary(err error) bool {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		switch errno {
		case syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED:
			return true
		}
	}
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

func isTimeout(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }

// fail records a failed accept: the first of a burst is logged.
func (l *Listener) fail(err error) {
	if l.opts.Errors != nil {
		l.opts.Errors.Inc()
	}
	l.mu.Lock()
	first := l.failing == nil
	l.failing = err
	l.failed++
	if first {
		l.since = l.opts.Clock.Now()
	}
	l.mu.Unlock()
	if first {
		l.opts.Log.Error("accept failing: retrying with backoff until it works again",
			"listener", l.opts.Name, "addr", l.Addr().String(), "err", err)
	}
}

// recovered ends the burst in progress, if any, with one log line.
func (l *Listener) recovered() {
	l.mu.Lock()
	if l.failing == nil {
		l.mu.Unlock()
		return
	}
	n, since := l.failed, l.since
	l.failing, l.failed = nil, 0
	l.mu.Unlock()
	l.opts.Log.Info("accepting again", "listener", l.opts.Name, "addr", l.Addr().String(),
		"failed_accepts", n, "for", l.opts.Clock.Now().Sub(since).String())
}

// wait waits d, or less when the listener is closed meanwhile (false).
func (l *Listener) wait(d time.Duration) bool {
	t := l.opts.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return true
	case <-l.closed:
		return false
	}
}

// setDeadline sets the socket's accept deadline; false when it has none.
func (l *Listener) setDeadline(t time.Time) bool {
	d, ok := l.ln.(interface{ SetDeadline(time.Time) error })
	return ok && d.SetDeadline(t) == nil
}

// Err is the last error of the burst of failed accepts in progress, nil
// while the listener accepts: the system call's ("accept4: too many open
// files") when there is one, as its caller names the socket.
func (l *Listener) Err() error {
	l.mu.Lock()
	err := l.failing
	l.mu.Unlock()
	var se *os.SyscallError
	if errors.As(err, &se) {
		return se
	}
	return err
}

// Close closes the socket; later calls return the first's result. An
// Accept in progress returns.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() {
		close(l.closed)
		l.closeErr = l.ln.Close()
	})
	return l.closeErr
}

// Closed reports whether Close was called.
func (l *Listener) Closed() bool { return l.isClosed() }

// Done is closed when Close is called.
func (l *Listener) Done() <-chan struct{} { return l.closed }

func (l *Listener) isClosed() bool {
	select {
	case <-l.closed:
		return true
	default:
		return false
	}
}

// Addr is the socket's address.
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }
