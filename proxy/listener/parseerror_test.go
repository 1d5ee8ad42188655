package listener

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warden-dev/warden/policy"
)

// TestParseErrorsQuoteNoRequestBytes: the answer to a request fasthttp
// cannot read says what kind of mistake it was and never echoes the
// request's bytes (a Cookie with a stray control byte came back whole in
// the 400's body).
func TestParseErrorsQuoteNoRequestBytes(t *testing.T) {
	srv := ProxyServer(func(ctx *fasthttp.RequestCtx) { ctx.WriteString("ok") }, nil, slog.New(slog.DiscardHandler))
	l, err := Start("127.0.0.1:0", srv, Limits{MaxConns: 100, Timeouts: policy.ListenerTimeouts{Header: 10 * time.Second, BodyIdle: 10 * time.Second, Idle: 10 * time.Second}}, Config{Name: "ingress"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Shutdown(t.Context()) })
	tests := []struct{ name, head, want string }{
		{"control byte in a value", "GET / HTTP/1.1\r\nHost: a\r\nCookie: sid=SECRET\x01\r\n\r\n", "an invalid field value"},
		{"control byte in the target", "GET /SECRET\x01 HTTP/1.1\r\nHost: a\r\n\r\n", "an invalid request target"},
		{"bad Content-Length", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1SECRET\r\n\r\n", "an invalid Content-Length"},
		{"bad Transfer-Encoding", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: SECRET\r\n\r\n", "an invalid Transfer-Encoding"},
		{"bad version", "GET / HTTP/SECRET\r\nHost: a\r\n\r\n", "an unsupported HTTP version"},
		{"bad method", "SE\x01CRET / HTTP/1.1\r\nHost: a\r\n\r\n", "an invalid method"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.WriteString(c, tc.head); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), tc.want) {
				t.Errorf("%d %s, want 400 naming %q", resp.StatusCode, body, tc.want)
			}
			if strings.Contains(string(body), "SECRET") {
				t.Errorf("the answer quotes the request: %s", body)
			}
		})
	}
}
