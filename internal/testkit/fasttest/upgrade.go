package fasttest

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// UpgradeUpstream starts a net/http server that switches a request asking
// for "echo" (Upgrade: echo, Connection: upgrade) to a protocol that
// greets with "hello|", then answers every read in upper case until the
// client's end of stream, and then closes. Any other request gets 400
// with the Upgrade and Connection values it came with.
func UpgradeUpstream(t testing.TB) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "echo" || !strings.EqualFold(r.Header.Get("Connection"), "upgrade") {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, "upgrade="+r.Header.Get("Upgrade")+" connection="+r.Header.Get("Connection"))
			return
		}
		c, rw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close()
		_, _ = io.WriteString(rw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\nhello|")
		_ = rw.Flush()
		buf := make([]byte, 512)
		for {
			n, err := rw.Read(buf)
			if n > 0 {
				_, _ = c.Write(bytes.ToUpper(buf[:n]))
			}
			if err != nil {
				return
			}
		}
	}))
	t.Cleanup(s.Close)
	return s
}

// UpgradeHead is a request for target that asks to switch to "echo".
func UpgradeHead(target, host string) string {
	return "GET " + target + " HTTP/1.1\r\nHost: " + host + "\r\nConnection: keep-alive, Upgrade\r\nUpgrade: echo\r\n\r\n"
}

// CheckUpgrade sends head (an UpgradeHead) through the proxy at addr to an
// UpgradeUpstream, with bytes of the new protocol right behind it: the
// upstream's 101 must come back as sent, then bytes pass unread both ways
// (the early ones included), and each side's end of stream reaches the
// other.
func CheckUpgrade(t *testing.T, addr, head string) {
	t.Helper()
	resp, br, nc := FirstAnswer(t, addr, head+"early|")
	if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("Upgrade") != "echo" || resp.Header.Get("Connection") != "Upgrade" {
		t.Fatalf("%d %v, want the upstream's 101", resp.StatusCode, resp.Header)
	}
	_, _ = io.WriteString(nc, "ping")
	want := "hello|EARLY|PING"
	got := make([]byte, len(want))
	if _, err := io.ReadFull(br, got); err != nil || string(got) != want {
		t.Fatalf("read %q (%v), want %q", got, err, want)
	}
	// The client's end of stream reaches the upstream, which closes; that
	// reaches the client.
	_ = nc.(*net.TCPConn).CloseWrite()
	if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
		t.Fatalf("after the end of stream: %q %v, want EOF", rest, err)
	}
}
