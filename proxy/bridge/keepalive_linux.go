package bridge

import (
	"net"
	"syscall"
	"time"
)

// listenConfig sets keepalive once on the listening socket: Linux copies
// it to every accepted socket, which saves four setsockopt calls per client
// over setting it on each accepted connection.
func listenConfig(ka net.KeepAliveConfig) net.ListenConfig {
	if !ka.Enable {
		return net.ListenConfig{KeepAlive: -1}
	}
	secs := func(d time.Duration) int { return max(int(d/time.Second), 1) }
	return net.ListenConfig{KeepAlive: -1, Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			for _, o := range []struct{ level, opt, v int }{
				{syscall.SOL_SOCKET, syscall.SO_KEEPALIVE, 1},
				{syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE, secs(ka.Idle)},
				{syscall.IPPROTO_TCP, syscall.TCP_KEEPINTVL, secs(ka.Interval)},
				{syscall.IPPROTO_TCP, syscall.TCP_KEEPCNT, max(ka.Count, 1)},
			} {
				if serr == nil {
					serr = syscall.SetsockoptInt(int(fd), o.level, o.opt, o.v)
				}
			}
		})
		if err != nil {
			return err
		}
		return serr
	}}
}
