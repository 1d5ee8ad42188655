package listener

import (
	"bufio"
	"io"
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
	l, _ := serveLimited(t, func(ctx *fasthttp.RequestCtx) { ctx.WriteString("ok") }, slowLimits)
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
			status, body := answer(t, l.Addr().String(), tc.head)
			if status != http.StatusBadRequest || !strings.Contains(body, tc.want) {
				t.Errorf("%d %s, want 400 naming %q", status, body, tc.want)
			}
			if strings.Contains(body, "SECRET") {
				t.Errorf("the answer quotes the request: %s", body)
			}
		})
	}
}

// slowLimits have timeouts far beyond the tests' own 10 s bound on an
// answer: an answer that comes came at once, not from a timeout.
var slowLimits = Limits{MaxConns: 100, Timeouts: policy.ListenerTimeouts{Header: time.Minute, BodyIdle: time.Minute, Idle: time.Minute}}

// answer writes each part of a request to addr on a new connection, one
// write each, and reads one answer, waiting at most 10 s.
func answer(t *testing.T, addr string, parts ...string) (status int, body string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	for _, p := range parts {
		if _, err := io.WriteString(c, p); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to %q: %v", parts, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b)
}

// TestBareLFHeadRefusedAtOnce: a request head whose lines end in a bare LF
// never sends the CRLFCRLF fasthttp waits for; it is refused with 400 as
// soon as the bare LF arrives, not after the header timeout (a minute
// here, beyond answer's 10 s). A sound head keeps bare LFs in its body.
func TestBareLFHeadRefusedAtOnce(t *testing.T) {
	l, _ := serveLimited(t, echo, slowLimits)
	bare := []struct {
		name  string
		parts []string
	}{
		{"every line", []string{"GET / HTTP/1.1\nHost: a\n\n"}},
		{"the request line", []string{"GET / HTTP/1.1\nHost: a\r\n\r\n"}},
		{"a field line", []string{"GET / HTTP/1.1\r\nHost: a\nX: 1\r\n"}},
		{"across two reads", []string{"GET / HTTP/1.1\r", "\nHost: a\n"}},
	}
	for _, tc := range bare {
		t.Run(tc.name, func(t *testing.T) {
			if status, body := answer(t, l.Addr().String(), tc.parts...); status != http.StatusBadRequest || !strings.Contains(body, "bare LF") {
				t.Errorf("%d %s, want 400 naming the bare LF", status, body)
			}
		})
	}
	t.Run("sound head, bare LFs in the body", func(t *testing.T) {
		status, body := answer(t, l.Addr().String(), "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n", "a\n\nb\n")
		if status != http.StatusOK || body != "a\n\nb\n" {
			t.Errorf("%d %q, want 200 echoing the body", status, body)
		}
	})
}
