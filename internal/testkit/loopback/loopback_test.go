package loopback

import (
	"bufio"
	"io"
	"net"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// An echoing handle serves every connection. The clients stay open past
// Serve's cleanup (theirs is registered first, so it runs last): only
// Serve closing its side ends the handles blocked reading, or the cleanup
// would wait forever.
func TestServe(t *testing.T) {
	var clients []net.Conn
	t.Cleanup(func() {
		for _, c := range clients {
			c.Close()
		}
	})
	addr := Serve(t, func(c net.Conn) { io.Copy(c, c) })
	for range 3 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
		if _, err := io.WriteString(c, "ping\n"); err != nil {
			t.Fatal(err)
		}
		if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "ping\n" {
			t.Fatalf("echo: %q %v", line, err)
		}
	}
}
