// Package rawio reads and writes TCP sockets with raw system calls, for
// the data plane's hot connections (fasthttp's server side and the upstream
// pools).
//
// A socket read or write through the net package enters the system call
// the way a blocking call does: the goroutine's processor is released for
// the duration, and the runtime's monitor thread (sysmon) hands a processor
// stuck in a call for more than 20 µs to another thread. A write on
// loopback carries the receiver's whole TCP processing and often takes
// longer than that, so under proxy load sysmon wakes every 20 µs and
// processors keep moving between threads. Measured on the 2-core bench
// machine, that is 9% of a fasthttp proxy's CPU in sysmon and a further
// share in thread wake-ups.
//
// The sockets are non-blocking, so no read or write waits: it copies what
// fits and returns. Done as a raw call (RawSyscall through RawConn, the
// poller still used to wait for readiness), the processor stays with the
// goroutine, and sysmon has nothing to take back. Calls that copy a lot are
// left to the net package (see maxRaw), so a raw call never keeps a
// processor for long. What that gives up: a thread the kernel switches out
// on its way back from a raw call keeps its processor while it waits, where
// sysmon would have handed it on (proxy/README, "Raw socket I/O", says
// what that costs in latency).
//
// WrapLazy (and Listener) also keep a connection's deadlines lazily: the
// socket's moves only when the caller's comes sooner, or when the socket's
// passes while the caller's is still ahead.
package rawio

import (
	"net"
	"os"
	"syscall"
)

// maxRaw is the largest buffer read or written with a raw call: the
// request and response heads and bufio's 4–64 KiB flushes. Larger copies
// (streamed bodies through io.Copy) take the net package's path, which
// lets the processor go while the kernel copies.
const maxRaw = 64 << 10

// Listener wraps ln so that the TCP connections it accepts are raw
// connections with lazy deadlines (WrapLazy).
func Listener(ln net.Listener) net.Listener { return listener{ln} }

type listener struct{ net.Listener }

func (l listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return WrapLazy(c), nil
}

// Wrap returns c reading and writing with raw calls when it is a TCP
// connection on a system where that is done (Linux), else c itself. The
// result embeds the *net.TCPConn, so deadlines, SyscallConn, CloseWrite
// and the kernel-side copies of ReadFrom/WriteTo still work.
func Wrap(c net.Conn) net.Conn { return wrapWith(c, wrap) }

// WrapLazy returns c as Wrap does, and also keeps its deadlines lazily
// (on Linux): a deadline moved later stays the caller's until the socket's
// earlier one passes, when it is checked, and a deadline moved sooner
// reaches the socket at once. Reads, writes and timeouts behave as the
// net package's do, as long as c's deadlines are set only through the
// result: one set on the *net.TCPConn underneath would be taken for a
// stale one and moved.
func WrapLazy(c net.Conn) net.Conn { return wrapWith(c, wrapLazy) }

func wrapWith(c net.Conn, w func(*net.TCPConn, syscall.RawConn) net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	return w(tc, rc)
}

// WriteAwaitingReply writes all of p to c, as c.Write does, and then,
// when c is a raw connection, waits until c has something to read, without
// reading it: the exchange of a client that writes a request and then reads
// the reply. A plain Write followed by Read would first try a read that
// finds nothing (the peer has not answered yet) and only then wait; this
// saves that system call.
//
// The wait ends when the reply begins, the peer closes, or the read
// deadline passes; the next Read reports the last two, and an error is
// returned only when writing failed. c must not be written concurrently.
//
// Only what arrives after the call begins wakes the wait, so p must be
// the whole request: a peer that answered an earlier part (an HTTP server
// refusing a body after its head) would have nothing more to send, and
// the call would wait for the deadline.
func WriteAwaitingReply(c net.Conn, p []byte) (int, error) { return writeAwaitingReply(c, p) }

// opError dresses an error from a raw read or write as the net package
// dresses its own ("read tcp a->b: read: connection reset by peer"), so
// logs and 502 bodies read the same whichever path failed.
func opError(op string, c *net.TCPConn, err error) error {
	if oe, ok := err.(*net.OpError); ok {
		// RawConn names its operations "raw-read" and "raw-write".
		e := *oe
		e.Op = op
		return &e
	}
	if errno, ok := err.(syscall.Errno); ok {
		err = &net.OpError{Op: op, Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: os.NewSyscallError(op, errno)}
	}
	return err
}
