package splice

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warden-dev/warden/internal/testkit/fasttest"
)

// lingerServer serves requests with a handler that answers 413 from the
// head alone, reading none of the body, and hands the connection to
// set.Linger.
func lingerServer(t *testing.T, set *Set) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{
		StreamRequestBody: true,
		Handler: func(ctx *fasthttp.RequestCtx) {
			ctx.SetStatusCode(fasthttp.StatusRequestEntityTooLarge)
			ctx.SetBodyString("no")
			set.Linger(ctx)
		},
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown(); <-done })
	return ln.Addr().String()
}

// upload sends the head of a 64 MiB upload and its first sent bytes, and
// reads the answer, which must be the handler's 413 saying Connection:
// close.
func upload(t *testing.T, addr string, sent int) (net.Conn, *bufio.Reader) {
	t.Helper()
	head := "POST /u HTTP/1.1\r\nHost: x\r\nContent-Length: 67108864\r\n\r\n"
	resp, br, c := fasttest.FirstAnswer(t, addr, head+string(make([]byte, sent)))
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 413 || string(body) != "no" || !resp.Close {
		t.Fatalf("%d %q close=%v, want the 413 closing the connection", resp.StatusCode, body, resp.Close)
	}
	return c, br
}

// TestLinger: the answer comes while the client still sends; what it then
// sends is read and dropped, and once it stops the connection ends
// cleanly, not by a reset. A drain waits for a lingering close until its
// context ends, then cuts it; after the drain began the answer still goes
// out, and the connection closes without a linger.
func TestLinger(t *testing.T) {
	t.Run("read and dropped", func(t *testing.T) {
		var set Set
		c, br := upload(t, lingerServer(t, &set), 1<<20)
		if _, err := c.Write(make([]byte, 4<<20)); err != nil {
			t.Fatalf("sending on after the answer: %v", err)
		}
		c.(*net.TCPConn).CloseWrite()
		if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
			t.Fatalf("after the answer: %q %v, want the end", rest, err)
		}
	})
	t.Run("cut by a drain", func(t *testing.T) {
		var set Set
		_, br := upload(t, lingerServer(t, &set), 1<<20)
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if err := set.Drain(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("drain: %v, want the deadline", err)
		}
		// The client is still mid-body: the cut closes the connection,
		// by its end or a reset.
		if _, err := io.ReadAll(br); err != nil && !strings.Contains(err.Error(), "reset") {
			t.Fatalf("after the cut: %v", err)
		}
	})
	t.Run("after a drain began", func(t *testing.T) {
		var set Set
		if err := set.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
		// Only the part of the body that fasthttp reads ahead before it
		// calls the handler (8 KiB): its close then ends the connection
		// with nothing unread, so without a reset.
		_, br := upload(t, lingerServer(t, &set), 8<<10)
		if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
			t.Fatalf("after the answer: %q %v, want the end", rest, err)
		}
	})
}
