package rawio

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// lazyPair returns a connection with lazy deadlines (WrapLazy) and its
// peer, a plain *net.TCPConn.
func lazyPair(t *testing.T) (lazy, peer net.Conn) {
	t.Helper()
	a, b := pair(t)
	// a came through Listener, which wraps lazily; b was dialled and
	// wrapped with Wrap. The test drives a against b.
	return a, b
}

var longAgo = time.Unix(1, 0)

// TestLazyDeadlines: deadlines set through WrapLazy's connection behave as
// the net package's, whichever the socket holds underneath.
func TestLazyDeadlines(t *testing.T) {
	tests := []struct {
		name string
		run  func(t *testing.T, c, peer net.Conn)
	}{
		{"a read outlives the socket's earlier deadline", func(t *testing.T, c, peer net.Conn) {
			// The first deadline reaches the socket and passes at once;
			// the second, later, is the caller's.
			c.SetReadDeadline(longAgo)
			c.SetReadDeadline(time.Now().Add(time.Hour))
			go peer.Write([]byte("late"))
			buf := make([]byte, 8)
			n, err := c.Read(buf)
			if err != nil || string(buf[:n]) != "late" {
				t.Fatalf("Read = %q, %v; want the peer's bytes", buf[:n], err)
			}
		}},
		{"no deadline after one", func(t *testing.T, c, peer net.Conn) {
			c.SetReadDeadline(longAgo)
			c.SetReadDeadline(time.Time{})
			go peer.Write([]byte("x"))
			if _, err := c.Read(make([]byte, 1)); err != nil {
				t.Fatalf("Read with no deadline: %v", err)
			}
		}},
		{"a deadline moved later times out there", func(t *testing.T, c, peer net.Conn) {
			start := time.Now()
			c.SetReadDeadline(start.Add(10 * time.Millisecond))
			c.SetReadDeadline(start.Add(60 * time.Millisecond))
			_, err := c.Read(make([]byte, 1))
			if !isTimeout(err) {
				t.Fatalf("Read = %v, want a timeout", err)
			}
			if waited := time.Since(start); waited < 60*time.Millisecond {
				t.Fatalf("timed out after %v, before the deadline", waited)
			}
		}},
		{"a deadline moved sooner cuts a read short", func(t *testing.T, c, peer net.Conn) {
			c.SetReadDeadline(time.Now().Add(time.Hour))
			done := make(chan error, 1)
			go func() {
				_, err := c.Read(make([]byte, 1))
				done <- err
			}()
			// Whether the read is waiting yet or not, it must end.
			c.SetReadDeadline(longAgo)
			if err := <-done; !isTimeout(err) {
				t.Fatalf("Read = %v, want a timeout", err)
			}
		}},
		{"a passed deadline fails a read with data waiting", func(t *testing.T, c, peer net.Conn) {
			if _, err := peer.Write([]byte("x")); err != nil {
				t.Fatal(err)
			}
			c.SetReadDeadline(time.Now().Add(time.Hour))
			c.SetReadDeadline(longAgo)
			if _, err := c.Read(make([]byte, 1)); !isTimeout(err) {
				t.Fatalf("Read = %v, want a timeout", err)
			}
		}},
		{"a write outlives the socket's earlier deadline", func(t *testing.T, c, peer net.Conn) {
			// More than the socket buffers take, so the write waits for
			// the peer to read.
			msg := bytes.Repeat([]byte("w"), 16<<20)
			c.SetWriteDeadline(longAgo)
			c.SetWriteDeadline(time.Now().Add(time.Hour))
			got := make(chan int64, 1)
			go func() {
				n, _ := io.Copy(io.Discard, io.LimitReader(peer, int64(len(msg))))
				got <- n
			}()
			if n, err := c.Write(msg); n != len(msg) || err != nil {
				t.Fatalf("Write = %d, %v; want %d, nil", n, err, len(msg))
			}
			if n := <-got; n != int64(len(msg)) {
				t.Fatalf("peer read %d bytes", n)
			}
		}},
		{"a write times out at the deadline moved later", func(t *testing.T, c, peer net.Conn) {
			start := time.Now()
			c.SetWriteDeadline(start.Add(10 * time.Millisecond))
			c.SetWriteDeadline(start.Add(60 * time.Millisecond))
			// Nobody reads: the write stops once the buffers are full.
			n, err := c.Write(make([]byte, 64<<20))
			if !isTimeout(err) || n >= 64<<20 {
				t.Fatalf("Write = %d, %v; want a short write and a timeout", n, err)
			}
			if waited := time.Since(start); waited < 60*time.Millisecond {
				t.Fatalf("timed out after %v, before the deadline", waited)
			}
		}},
		{"io.Copy both ways past the socket's earlier deadlines", func(t *testing.T, c, peer net.Conn) {
			c.SetDeadline(longAgo)
			c.SetDeadline(time.Now().Add(time.Hour))
			msg := bytes.Repeat([]byte("c"), 4<<20)
			go func() {
				peer.Write(msg)
				peer.(interface{ CloseWrite() error }).CloseWrite()
			}()
			var in bytes.Buffer
			if n, err := io.Copy(&in, c); n != int64(len(msg)) || err != nil { // c.WriteTo
				t.Fatalf("copy from the lazy conn: %d, %v", n, err)
			}
			got := make(chan int64, 1)
			go func() {
				n, _ := io.Copy(io.Discard, peer)
				got <- n
			}()
			if n, err := io.Copy(c, &in); n != int64(len(msg)) || err != nil { // c.ReadFrom
				t.Fatalf("copy to the lazy conn: %d, %v", n, err)
			}
			c.(interface{ CloseWrite() error }).CloseWrite()
			if n := <-got; n != int64(len(msg)) {
				t.Fatalf("peer read %d bytes", n)
			}
		}},
		{"WriteAwaitingReply past the socket's earlier read deadline", func(t *testing.T, c, peer net.Conn) {
			c.SetReadDeadline(longAgo)
			c.SetReadDeadline(time.Now().Add(time.Hour))
			go func() {
				buf := make([]byte, 3)
				io.ReadFull(peer, buf)
				peer.Write([]byte("ok"))
			}()
			if n, err := WriteAwaitingReply(c, []byte("req")); n != 3 || err != nil {
				t.Fatalf("WriteAwaitingReply = %d, %v", n, err)
			}
			buf := make([]byte, 2)
			if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ok" {
				t.Fatalf("reply %q, %v", buf, err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, peer := lazyPair(t)
			if _, ok := c.(*lazyConn); !ok {
				t.Fatalf("Listener gave a %T, want lazy deadlines", c)
			}
			tt.run(t, c, peer)
		})
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) && errors.As(err, &ne) && ne.Timeout()
}

// TestLazyDeadlineNoAllocations: moving a deadline is on every request's
// path, twice or more.
func TestLazyDeadlineNoAllocations(t *testing.T) {
	c, _ := lazyPair(t)
	allocs := testing.AllocsPerRun(1000, func() {
		now := time.Now()
		c.SetReadDeadline(now.Add(90 * time.Second))
		c.SetReadDeadline(now.Add(60 * time.Second))
		c.SetDeadline(now.Add(24 * time.Hour))
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per move, want 0", allocs)
	}
}

// BenchmarkDeadlines is what an HTTP server's three moves a request cost,
// with the net package's deadlines and with lazy ones.
func BenchmarkDeadlines(b *testing.B) {
	for _, bc := range []struct {
		name string
		wrap func(net.Conn) net.Conn
	}{{"net", Wrap}, {"lazy", WrapLazy}} {
		b.Run(bc.name, func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer ln.Close()
			d, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			defer d.Close()
			c := bc.wrap(d)
			b.ReportAllocs()
			for b.Loop() {
				now := time.Now()
				c.SetReadDeadline(now.Add(90 * time.Second))
				c.SetReadDeadline(now.Add(60 * time.Second))
				c.SetReadDeadline(now.Add(24 * time.Hour))
			}
		})
	}
}
