package fasttest

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// FirstAnswer sends raw to addr on a connection of its own and returns the
// first answer, with the connection and its reader for what follows: for a
// head with Expect: 100-continue, 100 Continue (the caller then writes the
// body on c and reads the final answer from br) or the final answer; for
// one asking to switch protocols, the 101 and then the new protocol's
// bytes.
func FirstAnswer(t testing.TB, addr, head string) (resp *http.Response, br *bufio.Reader, c net.Conn) {
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
