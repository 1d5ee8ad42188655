package rawio

import (
	"io"
	"net"
	"sync"
	"syscall"
	"unsafe"
)

// conn is a TCP connection whose small reads and writes are raw calls.
type conn struct {
	*net.TCPConn
	rc     syscall.RawConn
	rd, wr op // net.Conn allows a Read and a Write at once
	pk     peekOp
	// The attempts RawConn runs, as method values bound once, so that a
	// call allocates nothing.
	read, write, writeThenWait func(fd uintptr) bool
	peekAt                     func(fd uintptr)
}

// op is one direction's call in progress. RawConn runs an attempt until it
// returns true, waiting on the poller for readiness between attempts; the
// attempt's arguments and results live here.
type op struct {
	mu    sync.Mutex // net.Conn allows concurrent calls
	p     []byte
	n     int
	errno syscall.Errno
}

func wrap(tc *net.TCPConn, rc syscall.RawConn) net.Conn {
	c := &conn{TCPConn: tc, rc: rc}
	c.read = c.rd.read
	c.write = c.wr.write
	c.writeThenWait = c.wr.writeThenWait
	c.peekAt = c.pk.at
	return c
}

// do runs attempt on p through RawConn's Read or Write.
func (o *op) do(p []byte, via func(func(fd uintptr) bool) error, attempt func(fd uintptr) bool) (int, syscall.Errno, error) {
	o.mu.Lock()
	o.p, o.n, o.errno = p, 0, 0
	err := via(attempt)
	n, errno := o.n, o.errno
	o.p = nil
	o.mu.Unlock()
	return n, errno, err
}

func (c *conn) Read(p []byte) (int, error) {
	if len(p) > maxRaw {
		return c.TCPConn.Read(p)
	}
	if len(p) == 0 {
		return 0, nil
	}
	n, errno, err := c.rd.do(p, c.rc.Read, c.read)
	raceWrite(p[:n])
	switch {
	case err != nil:
		return 0, opError("read", c.TCPConn, err)
	case errno != 0:
		return 0, opError("read", c.TCPConn, errno)
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// read is one attempt: false when nothing is there yet (the poller then
// waits for the socket to become readable).
func (o *op) read(fd uintptr) bool {
	n, e := call(syscall.SYS_READ, fd, o.p)
	switch e {
	case syscall.EAGAIN:
		return false
	case 0:
		o.n = n
	default:
		o.errno = e
	}
	return true
}

// call makes one raw read or write of b, again when a signal interrupted it.
func call(trap, fd uintptr, b []byte) (int, syscall.Errno) {
	for {
		n, _, e := syscall.RawSyscall(trap, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
		if e != syscall.EINTR {
			return int(n), e
		}
	}
}

func (c *conn) Write(p []byte) (int, error) {
	if len(p) > maxRaw {
		return c.TCPConn.Write(p)
	}
	if len(p) == 0 {
		return 0, nil
	}
	raceRead(p)
	n, errno, err := c.wr.do(p, c.rc.Write, c.write)
	switch {
	case err != nil:
		return n, opError("write", c.TCPConn, err)
	case errno != 0:
		return n, opError("write", c.TCPConn, errno)
	}
	return n, nil
}

// write writes what the socket takes, and is called again, after the
// poller saw room, for the rest: a Write returns when all of p is written
// or on an error, as the net package's does. False: no room yet.
func (o *op) write(fd uintptr) bool {
	for o.n < len(o.p) {
		n, e := call(syscall.SYS_WRITE, fd, o.p[o.n:])
		switch {
		case e == syscall.EAGAIN, e == 0 && n == 0:
			return false
		case e != 0:
			o.errno = e
			return true
		}
		o.n += n
	}
	return true
}

func writeAwaitingReply(c net.Conn, p []byte) (int, error) {
	if len(p) == 0 || len(p) > maxRaw {
		return c.Write(p)
	}
	switch rc := c.(type) {
	case *conn:
		return rc.writeAwaitingReply(p)
	case *lazyConn:
		return rc.writeAwaitingReply(p)
	}
	return c.Write(p)
}

// writeAwaitingReply writes p from inside RawConn.Read: Read clears the
// socket's readiness before calling, so every byte of the reply arrives
// after that and wakes the wait that follows the write. The reply is not
// read here; the caller's next Read finds it at its first attempt.
func (c *conn) writeAwaitingReply(p []byte) (int, error) {
	raceRead(p)
	// The write side's op, whatever lock RawConn.Read takes: writes stay
	// serialised with Write.
	n, errno, _ := c.wr.do(p, c.rc.Read, c.writeThenWait)
	switch {
	case errno != 0:
		return n, opError("write", c.TCPConn, errno)
	case n == len(p):
		// Written. A wait cut short (deadline, close) is the next Read's
		// to report: the request went out, and that must read as a
		// failure to get the reply, not to send.
		return n, nil
	}
	// The read side refused before writing (its deadline, a close) or the
	// socket had no room for all of p: the write path finishes, and its
	// error is the one that describes the write.
	m, err := c.Write(p[n:])
	return n + m, err
}

// writeThenWait writes all of o.p and returns false, so RawConn.Read waits
// for the socket to become readable, then returns true without reading.
// It stops early when the socket has no room or a call fails, leaving the
// rest to Write.
func (o *op) writeThenWait(fd uintptr) bool {
	if o.n == len(o.p) {
		return true // called again: readable
	}
	if o.write(fd) && o.errno == 0 {
		return false // all written: wait for the reply
	}
	return true // no room, or a failed call: Write finishes or reports it
}

func (c *conn) peek() Peeked { return c.pk.run(c.rc, c.peekAt) }
