package rawio

import (
	"net"
	"syscall"
)

// Peeked is what Peek found on a connection.
type Peeked uint8

const (
	PeekUnknown Peeked = iota // not a socket Peek can look at here
	PeekNothing               // open, nothing to read yet
	PeekData                  // open, with bytes waiting
	PeekClosed                // end of stream, reset, or closed here: nothing will come
)

// Peek asks the kernel what c has to read, without waiting and without
// consuming anything. A connection pool asks it of an idle connection (only
// PeekNothing means it can carry a request: bytes nobody asked for, a 408
// or a close_notify, mean the upstream is done with it), and a proxy of its
// client after a failed exchange (PeekClosed: the client gave up, so the
// upstream is not to blame). A deadline-based read cannot do this: Go fails
// a read whose deadline has passed before it asks the kernel. Peek never
// waits, whatever c's deadlines, and may run while c is being read.
func Peek(c net.Conn) Peeked {
	if p, ok := c.(peeker); ok {
		return p.peek()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return PeekUnknown
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return PeekClosed
	}
	return peek(rc)
}

// peeker is a raw connection, which peeks without allocating.
type peeker interface{ peek() Peeked }
