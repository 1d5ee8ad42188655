package listener

import (
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/warden-dev/warden/policy"
)

// ErrBodyIdle is in the error of a read of a request body that waited
// longer than the listener's body_idle for the client: the body stalled.
// The error is also a timeout (net.Error), so fasthttp answers one met
// before the handler runs with 408; handlers check for it before their
// own deadlines, which are timeouts too.
var ErrBodyIdle = errors.New("request body stalled: nothing arrived for the listener's body_idle")

// ErrBareLF is the error of a read that found a line of a connection's
// first request head ended by a bare LF. fasthttp waits for the CRLFCRLF
// that ends a head, which such a client never sends: without this it
// would hold the connection until the header timeout, then answer 408.
var ErrBareLF = errors.New("a line of the request head ends in a bare LF, not CRLF")

// counted is a connection the gate let through: uncounted once, when it
// is closed, whoever closes it (the server, a hijacker, a drain).
type counted struct {
	net.Conn
	g      *gate
	closed atomic.Bool
	timed  atomic.Bool // a listener timeout has been counted
}

func (c *counted) Close() error {
	err := c.Conn.Close()
	if c.closed.CompareAndSwap(false, true) {
		c.g.release()
	}
	return err
}

// SyscallConn and CloseWrite are the socket's: rawio.Peek looks at the
// socket through the first, a tunnel half-closes with the second.
func (c *counted) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, errors.ErrUnsupported
	}
	return sc.SyscallConn()
}

func (c *counted) CloseWrite() error {
	cw, ok := c.Conn.(interface{ CloseWrite() error })
	if !ok {
		return errors.ErrUnsupported
	}
	return cw.CloseWrite()
}

// timedOut counts a listener timeout once per connection: a read that
// timed out is often asked again before the connection closes.
func (c *counted) timedOut(count func()) {
	if c.timed.CompareAndSwap(false, true) {
		count()
	}
}

// phase is where a fasthttp connection is in its request cycle.
type phase uint32

const (
	phaseHead phase = iota // a request's head is awaited or arriving: the header timeout runs
	phaseBody              // the head is in: each read of the body waits at most body_idle
	phaseIdle              // between requests: the idle timeout runs
	phaseOff               // hijacked (a tunnel): the listener sets no deadline
)

// conn is a connection of a fasthttp listener. It keeps the slow-client
// timeouts itself, with read deadlines, rather than fasthttp:
//
//   - header, from the accept (later requests: from their first byte,
//     fasthttp's StateActive) to the end of the head;
//   - body_idle, for each read of the body from then on, the ones
//     fasthttp makes before the handler runs included: a read that waits
//     longer for the client fails (ErrBodyIdle);
//   - idle, from the end of a response (StateIdle) to the next request's
//     first byte.
//
// The end of the head is the one read deadline fasthttp sets itself: the
// server's ReadTimeout and IdleTimeout are left unset, and HeaderReceived
// asks for one (Start). In the body phase a deadline a handler sets
// (a target's timeout) bounds the reads too, whichever comes first. The
// timeouts are the listener's when the connection was accepted.
type conn struct {
	counted
	to    policy.ListenerTimeouts
	phase atomic.Uint32
	first headScan // read only by the serving goroutine, in the head phase

	mu   sync.Mutex
	hard time.Time // the read deadline the server or a handler set (zero: none)
	gap  time.Time // when the body read in progress fails for body_idle (zero: never)
}

func newConn(c net.Conn, g *gate, to policy.ListenerTimeouts) *conn {
	nc := &conn{counted: counted{Conn: c, g: g}, to: to}
	_ = c.SetReadDeadline(after(to.Header))
	return nc
}

// after is the deadline d from now; zero (none) for d zero.
func after(d time.Duration) time.Time {
	if d <= 0 {
		return time.Time{}
	}
	return time.Now().Add(d)
}

func (c *conn) Read(p []byte) (int, error) {
	if phase(c.phase.Load()) == phaseBody {
		return c.readBody(p)
	}
	return c.read(p)
}

// read reads under the deadline the phase has set.
func (c *conn) read(p []byte) (int, error) {
	ph := phase(c.phase.Load())
	n, err := c.Conn.Read(p)
	if ph == phaseHead && !c.first.done {
		if serr := c.first.scan(p[:n]); serr != nil {
			return 0, serr
		}
	}
	if err != nil && ph != phaseOff && errors.Is(err, os.ErrDeadlineExceeded) {
		if ph == phaseIdle {
			c.timedOut(c.g.m.idle.Inc)
		} else {
			c.timedOut(c.g.m.header.Inc)
		}
	}
	return n, err
}

// readBody reads with the body's deadline: body_idle from now, or the
// handler's when that comes first.
func (c *conn) readBody(p []byte) (int, error) {
	c.mu.Lock()
	if phase(c.phase.Load()) != phaseBody {
		// Hijacked meanwhile: a tunnel's read, under the tunnel's deadline.
		c.mu.Unlock()
		return c.read(p)
	}
	c.gap = after(c.to.BodyIdle)
	_ = c.Conn.SetReadDeadline(c.deadlineLocked())
	c.mu.Unlock()
	n, err := c.Conn.Read(p)
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) && c.stalled() {
		c.timedOut(c.g.m.bodyIdle.Inc)
		return n, &stallError{err}
	}
	return n, err
}

// deadlineLocked is the body phase's read deadline: the sooner of the
// read's body_idle and the handler's deadline.
func (c *conn) deadlineLocked() time.Time {
	if c.gap.IsZero() || (!c.hard.IsZero() && !c.hard.After(c.gap)) {
		return c.hard
	}
	return c.gap
}

// stalled reports whether a read that timed out ran into body_idle rather
// than a deadline set by the handler.
func (c *conn) stalled() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return phase(c.phase.Load()) == phaseBody && !c.gap.IsZero() && c.deadlineLocked().Equal(c.gap) &&
		!time.Now().Before(c.gap)
}

// SetReadDeadline sets the deadline a handler (or fasthttp) asks for. In
// the head phase the call is fasthttp's, at the end of the head: the body
// phase begins.
func (c *conn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch phase(c.phase.Load()) {
	case phaseHead:
		c.hard, c.gap = time.Time{}, time.Time{}
		c.phase.Store(uint32(phaseBody))
		return nil // each body read sets its own
	case phaseBody:
		c.hard = t
		return c.Conn.SetReadDeadline(c.deadlineLocked())
	}
	c.hard = t
	return c.Conn.SetReadDeadline(t)
}

func (c *conn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.Conn.SetWriteDeadline(t)
}

// active: a request's first byte is in (fasthttp's StateActive). The
// first request's header timeout has run since the accept.
func (c *conn) active() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if phase(c.phase.Load()) == phaseIdle {
		c.phase.Store(uint32(phaseHead))
		_ = c.Conn.SetReadDeadline(after(c.to.Header))
	}
}

// idle: the response is out and the next request is awaited
// (StateIdle); fasthttp has lifted a handler's deadline by then.
func (c *conn) idle() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.phase.Store(uint32(phaseIdle))
	c.hard, c.gap = time.Time{}, time.Time{}
	_ = c.Conn.SetReadDeadline(after(c.to.Idle))
}

// handOff: the connection is hijacked (StateHijacked): its reads are the
// hijacker's, under the deadline it set.
func (c *conn) handOff() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.phase.Store(uint32(phaseOff))
	_ = c.Conn.SetReadDeadline(c.hard)
}

// headScan follows a connection's first request head as it is read, up
// to the CRLFCRLF that ends it, for a line ended by a bare LF. Only the
// first head is looked at: later ones may arrive with the bytes of the
// request before them (pipelining), where no read marks their start. A
// client whose first head is sound and a later one not waits out the
// header timeout (408); one whose head ends in CRLFCRLF with a bare LF
// inside is refused by the data plane's own head scan (proxy/httpwire).
type headScan struct {
	done bool   // the head's end was read: nothing more to look at
	last uint32 // the last four bytes read, the latest lowest
}

// crlfcrlf is headScan.last when the head has just ended.
const crlfcrlf = '\r'<<24 | '\n'<<16 | '\r'<<8 | '\n'

func (h *headScan) scan(b []byte) error {
	for _, c := range b {
		if c == '\n' && byte(h.last) != '\r' {
			return ErrBareLF
		}
		if h.last = h.last<<8 | uint32(c); h.last == crlfcrlf {
			h.done = true
			return nil
		}
	}
	return nil
}

// stallError is a body read that ran into body_idle: a timeout, and
// ErrBodyIdle.
type stallError struct{ err error }

func (e *stallError) Error() string   { return ErrBodyIdle.Error() + ": " + e.err.Error() }
func (e *stallError) Unwrap() []error { return []error{ErrBodyIdle, e.err} }
func (e *stallError) Timeout() bool   { return true }
func (e *stallError) Temporary() bool { return true }
