package fasttest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// UploadSize is the body CheckEarlyAnswer sends: more than any socket
// buffer on loopback holds, so that it cannot all be sent unread.
const UploadSize = 64 << 20

// RefusingUpstream starts a net/http server that answers every request 413
// from its head alone, reading none of its body, as a server refusing an
// upload does. With that much of the body unread, net/http closes the
// connection after the answer.
func RefusingUpstream(t testing.TB) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusRequestEntityTooLarge)
		_, _ = io.WriteString(w, "too large")
	}))
	t.Cleanup(s.Close)
	return s
}

// CheckEarlyAnswer sends head, a request announcing UploadSize bytes of
// body (a Content-Length, or chunked), through the proxy at addr to a
// RefusingUpstream, writing the body while it reads. The upstream's 413
// must come back, saying Connection: close, before the whole body has
// gone out; the client then stops sending, as curl does, and the
// connection must end cleanly, not by a reset.
func CheckEarlyAnswer(t *testing.T, addr, head string) {
	t.Helper()
	CheckAnswerBeforeBody(t, addr, head, http.StatusRequestEntityTooLarge, "too large")
}

// CheckAnswerBeforeBody sends head, a request announcing UploadSize bytes
// of body, through the proxy at addr, writing the body while it reads: the
// answer must be status with body (or, when body starts with "~", a body
// containing the rest), come before the whole body has gone out and say
// Connection: close; the client then stops sending, as curl does, and the
// connection must end cleanly, not by a reset.
func CheckAnswerBeforeBody(t *testing.T, addr, head string, status int, want string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	chunked := strings.Contains(strings.ToLower(head), "transfer-encoding: chunked")
	var sent atomic.Int64
	stop := make(chan struct{})
	wrote := make(chan error, 1)
	go func() {
		piece := make([]byte, 64<<10)
		_, err := io.WriteString(c, head)
		for err == nil && sent.Load() < UploadSize {
			select {
			case <-stop:
				wrote <- nil
				return
			default:
			}
			if chunked {
				_, err = fmt.Fprintf(c, "%x\r\n%s\r\n", len(piece), piece)
			} else {
				_, err = c.Write(piece)
			}
			sent.Add(int64(len(piece)))
		}
		if err == nil && chunked {
			_, err = io.WriteString(c, "0\r\n\r\n")
		}
		wrote <- err
	}()
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	at := sent.Load()
	body, err := io.ReadAll(resp.Body)
	match := string(body) == want
	if rest, ok := strings.CutPrefix(want, "~"); ok {
		match = strings.Contains(string(body), rest)
	}
	if resp.StatusCode != status || !match || err != nil {
		t.Fatalf("%d %q %v, want %d %q", resp.StatusCode, body, err, status, want)
	}
	if !resp.Close {
		t.Errorf("the answer keeps the connection open (%v); the rest of the body would be read as a request", resp.Header)
	}
	if at >= UploadSize {
		t.Errorf("the answer came after the whole body (%d bytes)", at)
	}
	close(stop)
	if err := <-wrote; err != nil {
		t.Fatalf("sending the body: %v", err)
	}
	_ = c.(*net.TCPConn).CloseWrite()
	if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
		t.Fatalf("after the answer: %q %v, want the end of the connection", rest, err)
	}
}
