package fasttest

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/warden-dev/warden/internal/testkit/loopback"
)

// HeadOnlyUpstream starts a server that answers each request with a head
// announcing a body longer than the proxies read whole (by length, or
// chunked for a path ending in "/chunked") and then closes the
// connection without sending any of it. Answered counts the heads sent.
type HeadOnlyUpstream struct {
	Addr     string
	Answered atomic.Int64
}

// StartHeadOnlyUpstream starts a HeadOnlyUpstream on loopback.
func StartHeadOnlyUpstream(t testing.TB) *HeadOnlyUpstream {
	u := &HeadOnlyUpstream{}
	u.Addr = loopback.Serve(t, func(c net.Conn) {
		req, err := http.ReadRequest(bufio.NewReader(c))
		if err != nil {
			return
		}
		head := "HTTP/1.1 200 OK\r\nContent-Length: 1048576\r\n\r\n"
		if strings.HasSuffix(req.URL.Path, "/chunked") {
			head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
		}
		u.Answered.Add(1)
		_, _ = io.WriteString(c, head)
	})
	return u
}

// CheckHeadOnlyAnswer sends raw, a whole request, through the proxy at
// addr to a HeadOnlyUpstream: the client must get a 502 naming the
// upstream control, since nothing of the upstream's answer had gone out
// when it failed, not a connection closed with no answer.
func CheckHeadOnlyAnswer(t *testing.T, addr, raw string) {
	t.Helper()
	resp, body := Raw(t, addr, raw)
	if resp.StatusCode != http.StatusBadGateway || resp.Header.Get("x-warden-control") != "upstream" {
		t.Fatalf("%d %q %s, want 502 from control upstream", resp.StatusCode, resp.Header.Get("x-warden-control"), body)
	}
}
