//go:build unix

package rawio

import (
	"sync"
	"syscall"
	"unsafe"
)

// peekOp is a peek's result, kept on a raw connection so that its
// attempt is a method value bound once and a peek allocates nothing (a
// pool peeks at every connection it hands out).
type peekOp struct {
	mu  sync.Mutex
	got Peeked
	buf [1]byte
}

// at asks the kernel, without waiting and without consuming, what fd has.
// The system call is made raw: syscall.Recvfrom would decode (and
// allocate) a source address nobody needs.
func (o *peekOp) at(fd uintptr) {
	var n uintptr
	var errno syscall.Errno
	for {
		n, _, errno = syscall.Syscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&o.buf[0])), 1,
			syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
		if errno != syscall.EINTR {
			break
		}
	}
	switch {
	case errno == 0 && n > 0:
		o.got = PeekData
	case errno == 0:
		o.got = PeekClosed
	case errno == syscall.EAGAIN || errno == syscall.EWOULDBLOCK:
		o.got = PeekNothing
	case errno == syscall.ECONNRESET || errno == syscall.EPIPE:
		o.got = PeekClosed
	default:
		o.got = PeekUnknown
	}
}

// run peeks through rc with attempt, o's bound at.
func (o *peekOp) run(rc syscall.RawConn, attempt func(fd uintptr)) Peeked {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.got = PeekUnknown
	// Control, not Read: Read fails at once when the read deadline has
	// passed, and waits for a Read in progress on another goroutine.
	if err := rc.Control(attempt); err != nil {
		return PeekClosed // the descriptor is closed: nothing will come
	}
	return o.got
}

// peek is for a connection that is not one of ours: it allocates.
func peek(rc syscall.RawConn) Peeked {
	var o peekOp
	return o.run(rc, o.at)
}
