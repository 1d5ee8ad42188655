//go:build unix

package dbpool

import (
	"net"
	"syscall"
)

// alive reports whether a kept connection is still fit to lend: open, and
// with nothing unread (a server that closed it or said something while it
// was idle has made it unusable). It peeks without blocking.
func alive(c *net.TCPConn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return false
	}
	ok := false
	err = rc.Read(func(fd uintptr) bool {
		var b [1]byte
		_, _, e := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		ok = e == syscall.EAGAIN || e == syscall.EWOULDBLOCK
		return true
	})
	return err == nil && ok
}
