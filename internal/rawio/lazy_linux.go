package rawio

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// lazyConn is a raw connection whose deadlines reach the socket only when
// they come sooner than the one the socket has.
//
// An HTTP server moves a connection's read deadline three times a request
// (the idle wait, the head, the body), almost always later than the last,
// and a pool moves its upstream's once or twice. Each move is a poller
// call that locks the descriptor and re-files a runtime timer: about
// 140 ns here, three to five times a request. Kept lazily, the socket's
// deadline stays put while the caller's moves later, and a timeout it
// reports is checked against the caller's: one that has not passed moves
// the socket's deadline there, and the call is made again. A deadline
// moved sooner (to cut a wait short) reaches the socket at once.
type lazyConn struct {
	*conn
	rdl, wdl deadline
}

// deadline is one direction's: what the caller asked for, and what the
// socket has, which never comes after it (zero: none).
type deadline struct {
	mu   sync.Mutex
	want time.Time
	set  time.Time
}

func wrapLazy(tc *net.TCPConn, rc syscall.RawConn) net.Conn {
	return &lazyConn{conn: wrap(tc, rc).(*conn)}
}

// move records t as the caller's deadline and gives it to the socket
// when it comes sooner than the socket's own.
func (d *deadline) move(t time.Time, tc *net.TCPConn, read bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.want = t
	if t.IsZero() || (!d.set.IsZero() && !t.Before(d.set)) {
		// The socket's deadline, if any, comes first; when it passes,
		// expired compares with t.
		return nil
	}
	if err := setDeadline(tc, read, t); err != nil {
		return err
	}
	d.set = t
	return nil
}

// expired reports whether a timeout the socket reported is the caller's.
// When the caller's deadline is still ahead (or gone), the socket's moves
// to it, and the call is to be made again.
func (d *deadline) expired(tc *net.TCPConn, read bool) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.want.IsZero() && !time.Now().Before(d.want) {
		return true
	}
	if setDeadline(tc, read, d.want) != nil {
		return true
	}
	d.set = d.want
	return false
}

func setDeadline(tc *net.TCPConn, read bool, t time.Time) error {
	if read {
		return tc.SetReadDeadline(t)
	}
	return tc.SetWriteDeadline(t)
}

func timedOut(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }

func (c *lazyConn) SetReadDeadline(t time.Time) error  { return c.rdl.move(t, c.TCPConn, true) }
func (c *lazyConn) SetWriteDeadline(t time.Time) error { return c.wdl.move(t, c.TCPConn, false) }

func (c *lazyConn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}

func (c *lazyConn) Read(p []byte) (int, error) {
	for {
		n, err := c.conn.Read(p)
		if err == nil || !timedOut(err) || c.rdl.expired(c.TCPConn, true) {
			return n, err
		}
	}
}

// Write writes p, again from where it stopped after a timeout that was
// not the caller's.
func (c *lazyConn) Write(p []byte) (int, error) {
	done := 0
	for {
		n, err := c.conn.Write(p[done:])
		done += n
		if err == nil || !timedOut(err) || c.wdl.expired(c.TCPConn, false) {
			return done, err
		}
	}
}

// ReadFrom and WriteTo replace the *net.TCPConn's, which would read or
// write the socket under its own deadlines and report a timeout that is
// not the caller's.
func (c *lazyConn) ReadFrom(r io.Reader) (int64, error) {
	return io.Copy(struct{ io.Writer }{c}, r)
}

func (c *lazyConn) WriteTo(w io.Writer) (int64, error) {
	return io.Copy(w, struct{ io.Reader }{c})
}

func (c *lazyConn) writeAwaitingReply(p []byte) (int, error) {
	n, err := c.conn.writeAwaitingReply(p)
	if err != nil && timedOut(err) && !c.wdl.expired(c.TCPConn, false) {
		m, err := c.Write(p[n:])
		return n + m, err
	}
	return n, err
}
