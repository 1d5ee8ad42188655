//go:build !unix

package dbpool

import "net"

// alive cannot peek on this platform; a dead kept connection shows up as an
// error on the client's first query.
func alive(*net.TCPConn) bool { return true }
