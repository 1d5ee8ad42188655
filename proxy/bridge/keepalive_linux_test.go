package bridge

import (
	"syscall"
	"testing"

	"github.com/warden-dev/warden/governor/clock"
)

// Accepted client sockets carry TCP keepalive, so that a client whose
// machine vanished is noticed and reaped as gone.
func TestClientSocketsKeepAlive(t *testing.T) {
	h := newHarness(t, clock.Real{}, nil)
	h.mustApply(tcpBridge("ka", echoServer(t)))
	c := h.dialTCP("ka")
	c.echo("x")
	b := h.bridge("ka")
	b.mu.Lock()
	var s *session
	for s = range b.sessions {
	}
	b.mu.Unlock()
	rc, err := s.cl.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	_ = rc.Control(func(fd uintptr) {
		got["keepalive"], _ = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_KEEPALIVE)
		got["idle"], _ = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE)
		got["interval"], _ = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_KEEPINTVL)
		got["count"], _ = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_KEEPCNT)
	})
	want := map[string]int{"keepalive": 1, "idle": 15, "interval": 5, "count": 3} // Options defaults
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %d, want %d", k, got[k], v)
		}
	}
}
