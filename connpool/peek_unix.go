//go:build unix

package connpool

import (
	"net"
	"syscall"
)

// peekIdle asks the kernel whether an idle connection has anything to
// read, without consuming it and without blocking: nothing (EAGAIN) means
// alive; end of stream or unexpected bytes mean the upstream is done with
// it. A deadline-based read cannot do this: Go fails a read whose deadline
// has passed before it asks the kernel.
func peekIdle(nc net.Conn) bool {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	alive := false
	var buf [1]byte
	err = rc.Read(func(fd uintptr) bool {
		n, _, errno := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		alive = n < 0 && (errno == syscall.EAGAIN || errno == syscall.EWOULDBLOCK)
		return true // never wait for readiness
	})
	return err == nil && alive
}
