//go:build unix

package rawio

import "syscall"

func peek(rc syscall.RawConn) Peeked {
	got := PeekUnknown
	var buf [1]byte
	// Control, not Read: Read fails at once when the read deadline has
	// passed, and waits for a Read in progress on another goroutine.
	err := rc.Control(func(fd uintptr) {
		n, _, errno := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case n > 0:
			got = PeekData
		case n == 0 && errno == nil:
			got = PeekClosed
		case errno == syscall.EAGAIN || errno == syscall.EWOULDBLOCK:
			got = PeekNothing
		case errno == syscall.ECONNRESET || errno == syscall.EPIPE:
			got = PeekClosed
		}
	})
	if err != nil {
		return PeekClosed // the descriptor is closed: nothing will come
	}
	return got
}
