package bridge

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"
)

// sockIO reads and writes a socket on the data path with raw system calls
// made inside the netpoller's RawConn callbacks. The sockets are
// non-blocking, so the calls never block: EAGAIN hands the wait to the
// netpoller as usual (deadlines and Close still interrupt it). What this
// skips is the runtime's system call bookkeeping, which on a proxy costs
// more than the copy: each time the process wakes from being wholly idle —
// once or twice per transaction — the first bookkept system call also wakes
// the runtime's monitor thread, and long ones hand the P to another thread.
type sockIO struct{ rc syscall.RawConn }

func newSockIO(c *net.TCPConn) sockIO {
	rc, err := c.SyscallConn()
	if err != nil {
		// Only a closed connection has no RawConn; its reads fail anyway.
		panic("bridge: SyscallConn of an open TCP connection: " + err.Error())
	}
	return sockIO{rc}
}

// Read reads once into p; io.EOF at the end of the stream.
func (s sockIO) Read(p []byte) (int, error) {
	var n int
	var errno syscall.Errno
	err := s.rc.Read(func(fd uintptr) bool {
		for {
			r, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
			switch e {
			case syscall.EINTR:
				continue
			case syscall.EAGAIN:
				return false
			}
			n, errno = int(r), e
			return true
		}
	})
	switch {
	case err != nil:
		return 0, err
	case errno != 0:
		return 0, os.NewSyscallError("read", errno)
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// Write writes all of p.
func (s sockIO) Write(p []byte) (int, error) {
	written := 0
	var errno syscall.Errno
	err := s.rc.Write(func(fd uintptr) bool {
		for written < len(p) {
			r, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&p[written])), uintptr(len(p)-written))
			switch e {
			case 0:
				written += int(r)
			case syscall.EINTR:
			case syscall.EAGAIN:
				return false
			default:
				errno = e
				return true
			}
		}
		return true
	})
	switch {
	case err != nil:
		return written, err
	case errno != 0:
		return written, os.NewSyscallError("write", errno)
	}
	return written, nil
}
