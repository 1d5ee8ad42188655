package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// serveRelay is a TCP relay, not an HTTP proxy: every client connection
// gets an upstream connection of its own and bytes are copied both ways
// unread. It runs one event loop per P, each on its own OS thread with its
// own SO_REUSEPORT listener and its own epoll_wait, as HAProxy's threads
// do, so the kernel wakes the thread an event is for and the Go scheduler
// never hands work between threads. Its row is the ceiling of a Go proxy
// on this machine: what the runtime's goroutine wake-ups cost the fasthttp
// rows, with no HTTP work at all.
func serveRelay(listen, upstream string) {
	la, err := net.ResolveTCPAddr("tcp4", listen)
	if err == nil {
		var ua *net.TCPAddr
		ua, err = net.ResolveTCPAddr("tcp4", upstream)
		if err == nil {
			errc := make(chan error, runtime.GOMAXPROCS(0))
			for range runtime.GOMAXPROCS(0) {
				go func() { errc <- relayLoop(inet4(la), inet4(ua)) }()
			}
			err = <-errc
		}
	}
	fmt.Fprintln(os.Stderr, "relay:", err)
	os.Exit(1)
}

func inet4(a *net.TCPAddr) *unix.SockaddrInet4 {
	s := &unix.SockaddrInet4{Port: a.Port}
	copy(s.Addr[:], a.IP.To4())
	return s
}

// half is one direction of a relayed pair: bytes read from fd wait in
// pending until peer takes them.
type half struct {
	fd, peer int
	pending  []byte
	buf      []byte
}

func relayLoop(listen, upstream *unix.SockaddrInet4) error {
	runtime.LockOSThread()
	lfd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	if err := unix.SetsockoptInt(lfd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		return err
	}
	if err := unix.SetsockoptInt(lfd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
		return err
	}
	if err := unix.Bind(lfd, listen); err != nil {
		return fmt.Errorf("bind: %w", err)
	}
	if err := unix.Listen(lfd, 1024); err != nil {
		return err
	}
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return err
	}
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, lfd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(lfd)}); err != nil {
		return err
	}
	halves := map[int]*half{}
	closePair := func(h *half) {
		for _, fd := range []int{h.fd, h.peer} {
			delete(halves, fd)
			unix.Close(fd) // closing removes it from the epoll set
		}
	}
	// watch sets what fd waits for: reading, or (while its peer's bytes
	// wait for it) writing.
	watch := func(fd int, ev uint32) {
		_ = unix.EpollCtl(ep, unix.EPOLL_CTL_MOD, fd, &unix.EpollEvent{Events: ev, Fd: int32(fd)})
	}
	// flush writes what h read to its peer; a full socket parks the rest,
	// stops reading h and waits for the peer to drain.
	flush := func(h *half) bool {
		for len(h.pending) > 0 {
			n, err := unix.Write(h.peer, h.pending)
			if errors.Is(err, unix.EAGAIN) {
				watch(h.fd, 0)
				watch(h.peer, unix.EPOLLOUT)
				return true
			}
			if err != nil {
				return false
			}
			h.pending = h.pending[n:]
		}
		return true
	}
	events := make([]unix.EpollEvent, 128)
	for {
		n, err := unix.EpollWait(ep, events, -1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("epoll_wait: %w", err)
		}
		for _, ev := range events[:n] {
			fd := int(ev.Fd)
			if fd == lfd {
				for {
					cfd, _, err := unix.Accept4(lfd, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
					if err != nil {
						break
					}
					if err := relayPair(ep, cfd, upstream, halves); err != nil {
						unix.Close(cfd)
					}
				}
				continue
			}
			h := halves[fd]
			if h == nil {
				continue
			}
			if ev.Events&unix.EPOLLOUT != 0 {
				// fd drained: its peer's parked bytes go out, then both read again.
				src := halves[h.peer]
				if !flush(src) {
					closePair(h)
					continue
				}
				if len(src.pending) == 0 {
					watch(fd, unix.EPOLLIN)
					watch(src.fd, unix.EPOLLIN)
				}
				continue
			}
			m, err := unix.Read(fd, h.buf)
			if errors.Is(err, unix.EAGAIN) {
				continue
			}
			if m <= 0 {
				closePair(h)
				continue
			}
			h.pending = h.buf[:m]
			if !flush(h) {
				closePair(h)
			}
		}
	}
}

// relayPair connects cfd's own upstream connection and watches both.
func relayPair(ep, cfd int, upstream *unix.SockaddrInet4, halves map[int]*half) error {
	ufd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	// A blocking connect is fine on loopback, where it completes at once.
	if err := unix.Connect(ufd, upstream); err != nil {
		unix.Close(ufd)
		return err
	}
	if err := unix.SetNonblock(ufd, true); err != nil {
		unix.Close(ufd)
		return err
	}
	for _, fd := range []int{cfd, ufd} {
		_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	}
	halves[cfd] = &half{fd: cfd, peer: ufd, buf: make([]byte, 32<<10)}
	halves[ufd] = &half{fd: ufd, peer: cfd, buf: make([]byte, 32<<10)}
	for _, fd := range []int{cfd, ufd} {
		if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}); err != nil {
			delete(halves, cfd)
			delete(halves, ufd)
			unix.Close(ufd)
			return err
		}
	}
	return nil
}
