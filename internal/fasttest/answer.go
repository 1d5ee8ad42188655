package fasttest

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// AskToContinue sends head (a request head announcing a body and carrying
// Expect: 100-continue) to addr, and returns the first answer: 100
// Continue, after which the caller writes the body on c and reads the
// final answer from br, or the final answer itself.
func AskToContinue(t testing.TB, addr, head string) (resp *http.Response, br *bufio.Reader, c net.Conn) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	br = bufio.NewReader(c)
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	return resp, br, c
}
