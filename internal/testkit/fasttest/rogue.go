package fasttest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"

	"github.com/warden-dev/warden/governor/metrics"
	"github.com/warden-dev/warden/internal/testkit/loopback"
)

// RogueUpstream answers every request with its path as the body and, when
// told to, writes a second response nobody asked for on the connection that
// answered last: the buggy backend whose extra bytes must never reach
// another client.
type RogueUpstream struct {
	Addr string

	mu   sync.Mutex
	last net.Conn
}

// StartRogueUpstream starts a RogueUpstream on loopback until the test ends.
func StartRogueUpstream(t testing.TB) *RogueUpstream {
	t.Helper()
	u := &RogueUpstream{}
	u.Addr = loopback.Serve(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, req.Body)
			path := req.URL.Path
			u.mu.Lock()
			_, err = fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(path), path)
			u.last = c
			u.mu.Unlock()
			if err != nil {
				return
			}
		}
	})
	return u
}

// misbehave writes an unrequested response on the connection that answered
// last. On loopback the bytes are in the proxy's socket buffer once the
// write returns.
func (u *RogueUpstream) misbehave(t testing.TB) {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.last == nil {
		t.Fatal("the rogue upstream has answered nothing yet")
	}
	if _, err := io.WriteString(u.last, "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\n/rogue"); err != nil {
		t.Fatalf("writing the unrequested response: %v", err)
	}
}

// CheckNoCrossedAnswers has two clients, each on its own connection, take
// turns through the proxy at addr to u, while u writes an unrequested
// response after each answer: every client must get the answer to its own
// request, and listener's unrequested-bytes counter must count each
// connection dropped for it. head builds the raw request for a path.
func CheckNoCrossedAnswers(t *testing.T, addr string, head func(path string) string, u *RogueUpstream, m *metrics.Metrics, listener string) {
	t.Helper()
	const rounds = 5
	for i := range rounds {
		for _, client := range []string{"/a", "/b"} {
			path := fmt.Sprintf("%s%d", client, i)
			resp, body := Raw(t, addr, head(path))
			if resp.StatusCode != http.StatusOK || string(body) != path {
				t.Fatalf("request for %s got %d %q: another request's answer, or bytes nobody asked for", path, resp.StatusCode, body)
			}
			u.misbehave(t)
		}
	}
	if got := Value(m.UnrequestedBytes.WithLabelValues(listener)); got < 2*rounds-1 {
		t.Errorf("warden_upstream_unrequested_bytes_total{listener=%q} = %v, want at least %d", listener, got, 2*rounds-1)
	}
}
