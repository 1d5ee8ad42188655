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
//
// One goroutine may read while another writes; each direction has its own
// state, with its callback bound once so that no call allocates.
type sockIO struct{ rd, wr *rawOp }

type rawOp struct {
	rc    syscall.RawConn
	p     []byte
	n     int
	errno syscall.Errno
	fn    func(fd uintptr) bool
}

func newSockIO(c *net.TCPConn) sockIO {
	rc, err := c.SyscallConn()
	if err != nil {
		// Only a nil connection has no RawConn.
		panic("bridge: SyscallConn of a TCP connection: " + err.Error())
	}
	rd, wr := &rawOp{rc: rc}, &rawOp{rc: rc}
	rd.fn, wr.fn = rd.read, wr.write
	return sockIO{rd, wr}
}

func (o *rawOp) read(fd uintptr) bool {
	for {
		r, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&o.p[0])), uintptr(len(o.p)))
		switch e {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false // wait on the netpoller
		}
		o.n, o.errno = int(r), e
		return true
	}
}

func (o *rawOp) write(fd uintptr) bool {
	for o.n < len(o.p) {
		r, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&o.p[o.n])), uintptr(len(o.p)-o.n))
		switch e {
		case 0:
			o.n += int(r)
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false // wait on the netpoller
		default:
			o.errno = e
			return true
		}
	}
	return true
}

// Read reads once into p; io.EOF at the end of the stream.
func (s sockIO) Read(p []byte) (int, error) {
	o := s.rd
	o.p, o.n, o.errno = p, 0, 0
	err := o.rc.Read(o.fn)
	n, errno := o.n, o.errno
	o.p = nil
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
	o := s.wr
	o.p, o.n, o.errno = p, 0, 0
	err := o.rc.Write(o.fn)
	n, errno := o.n, o.errno
	o.p = nil
	switch {
	case err != nil:
		return n, err
	case errno != 0:
		return n, os.NewSyscallError("write", errno)
	}
	return n, nil
}
