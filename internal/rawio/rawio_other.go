//go:build !linux

package rawio

import (
	"net"
	"syscall"
)

// Elsewhere the net package's reads and writes are kept.
func wrap(tc *net.TCPConn, _ syscall.RawConn) net.Conn { return tc }

func wrapLazy(tc *net.TCPConn, _ syscall.RawConn) net.Conn { return tc }

func writeAwaitingReply(c net.Conn, p []byte) (int, error) { return c.Write(p) }
