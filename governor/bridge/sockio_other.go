//go:build !linux

package bridge

import "net"

// sockIO is the connection itself where raw system calls are not used.
type sockIO struct{ *net.TCPConn }

func newSockIO(c *net.TCPConn) sockIO { return sockIO{c} }
