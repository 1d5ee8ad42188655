package rawio

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pair returns a connected pair: a through a wrapped listener, b dialled
// and wrapped, so both ends are raw connections.
func pair(t testing.TB) (a, b net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	wl := Listener(ln)
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := wl.Accept()
		if err != nil {
			t.Error(err)
		}
		accepted <- c
	}()
	d, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	a, b = <-accepted, Wrap(d)
	if a == nil {
		t.FailNow()
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func TestWrapKinds(t *testing.T) {
	a, b := pair(t)
	p1, p2 := net.Pipe()
	defer p1.Close()
	defer p2.Close()
	tests := []struct {
		name string
		in   net.Conn
		raw  bool
	}{
		{"accepted TCP", a, runtime.GOOS == "linux"},
		{"dialled TCP", b, runtime.GOOS == "linux"},
		{"pipe", Wrap(p1), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Off Linux the net package's type comes back, so the test
			// names that type rather than the Linux-only one.
			_, plain := tt.in.(*net.TCPConn)
			raw := !plain && tt.in != net.Conn(p1)
			if raw != tt.raw {
				t.Fatalf("raw = %v, want %v (%T)", raw, tt.raw, tt.in)
			}
		})
	}
	if Wrap(p1) != p1 {
		t.Fatal("a connection that is not TCP must come back as it was")
	}
}

// TestTransfer moves data through both the raw path (buffers up to maxRaw)
// and the net package's (larger), with a reader slower than the writer so
// that the socket buffer fills and writes wait for room.
func TestTransfer(t *testing.T) {
	tests := []struct {
		name         string
		total, chunk int
		readBuf      int
	}{
		{"small writes and reads", 4 << 20, 100, 512},
		{"bufio-sized", 16 << 20, 16 << 10, 4 << 10},
		{"at the raw limit", 16 << 20, maxRaw, maxRaw},
		{"above the raw limit", 16 << 20, 1 << 20, 256 << 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := pair(t)
			data := make([]byte, tt.total)
			for i := range data {
				data[i] = byte(i*7 + i>>9)
			}
			want := sha256.Sum256(data)
			errc := make(chan error, 1)
			go func() {
				for off := 0; off < len(data); off += tt.chunk {
					end := min(off+tt.chunk, len(data))
					n, err := a.Write(data[off:end])
					if err != nil || n != end-off {
						a.Close() // ends the reader's wait
						errc <- fmt.Errorf("wrote %d of %d bytes: %v", n, end-off, err)
						return
					}
				}
				errc <- a.(interface{ CloseWrite() error }).CloseWrite()
			}()
			h := sha256.New()
			buf := make([]byte, tt.readBuf)
			got := 0
			for {
				n, err := b.Read(buf)
				h.Write(buf[:n])
				got += n
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err, <-errc)
				}
				if got < len(data)/2 && got%(1<<20) < n {
					time.Sleep(time.Millisecond) // let the writer's socket buffer fill
				}
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			if got != len(data) || !bytes.Equal(h.Sum(nil), want[:]) {
				t.Fatalf("received %d bytes with a different digest, want %d", got, len(data))
			}
		})
	}
}

// TestConcurrentWrites: like the net package's, each Write goes out whole,
// never interleaved with another goroutine's.
func TestConcurrentWrites(t *testing.T) {
	a, b := pair(t)
	const writers, records, size = 4, 2000, 1000
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			rec := bytes.Repeat([]byte{byte('a' + w)}, size)
			for range records {
				if _, err := a.Write(rec); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	go func() { wg.Wait(); a.(interface{ CloseWrite() error }).CloseWrite() }()
	all, err := io.ReadAll(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != writers*records*size {
		t.Fatalf("read %d bytes, want %d", len(all), writers*records*size)
	}
	for off := 0; off < len(all); off += size {
		rec := all[off : off+size]
		if bytes.Count(rec, rec[:1]) != size {
			t.Fatalf("record at %d mixes writers: %q…", off, rec[:40])
		}
	}
}

func TestErrors(t *testing.T) {
	tests := []struct {
		name    string
		do      func(t *testing.T, a, b net.Conn) error
		is      error
		prefix  string
		timeout bool
	}{
		{"peer closed", func(t *testing.T, a, b net.Conn) error {
			a.Close()
			_, err := b.Read(make([]byte, 10))
			return err
		}, io.EOF, "EOF", false},
		{"read deadline", func(t *testing.T, a, b net.Conn) error {
			b.SetReadDeadline(time.Now().Add(-time.Second))
			_, err := b.Read(make([]byte, 10))
			return err
		}, os.ErrDeadlineExceeded, "read tcp ", true},
		{"read on a closed connection", func(t *testing.T, a, b net.Conn) error {
			b.Close()
			_, err := b.Read(make([]byte, 10))
			return err
		}, net.ErrClosed, "read tcp ", false},
		{"write on a closed connection", func(t *testing.T, a, b net.Conn) error {
			b.Close()
			_, err := b.Write([]byte("x"))
			return err
		}, net.ErrClosed, "write tcp ", false},
		{"reset by peer", func(t *testing.T, a, b net.Conn) error {
			a.(interface{ SetLinger(int) error }).SetLinger(0)
			a.Close()
			_, err := b.Read(make([]byte, 10))
			return err
		}, syscall.ECONNRESET, "read tcp ", false},
		{"write to a reset connection", func(t *testing.T, a, b net.Conn) error {
			a.(interface{ SetLinger(int) error }).SetLinger(0)
			a.Close()
			for {
				// The first write may still be taken; the reset is seen by a later one.
				if _, err := b.Write([]byte("x")); err != nil {
					return err
				}
			}
		}, syscall.ECONNRESET, "write tcp ", false},
		// WriteAwaitingReply fails as Write does.
		{"awaiting reply on a closed connection", func(t *testing.T, a, b net.Conn) error {
			b.Close()
			_, err := WriteAwaitingReply(b, []byte("x"))
			return err
		}, net.ErrClosed, "write tcp ", false},
		{"awaiting reply past the deadline", func(t *testing.T, a, b net.Conn) error {
			b.SetDeadline(time.Now().Add(-time.Second))
			_, err := WriteAwaitingReply(b, []byte("x"))
			return err
		}, os.ErrDeadlineExceeded, "write tcp ", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := pair(t)
			err := tt.do(t, a, b)
			if !errors.Is(err, tt.is) {
				t.Fatalf("err = %v, want one that is %v", err, tt.is)
			}
			if !strings.HasPrefix(err.Error(), tt.prefix) {
				t.Fatalf("err = %q, want it to start %q as the net package's do", err, tt.prefix)
			}
			var ne net.Error
			if timeout := errors.As(err, &ne) && ne.Timeout(); timeout != tt.timeout {
				t.Fatalf("Timeout() = %v, want %v", timeout, tt.timeout)
			}
		})
	}
}

// TestReadWaitsForData: a Read that finds nothing waits on the poller and
// wakes when data comes (and a deadline still ends the wait).
func TestReadWaitsForData(t *testing.T) {
	a, b := pair(t)
	got := make(chan string, 1)
	go func() {
		buf := make([]byte, 10)
		n, err := b.Read(buf)
		if err != nil {
			t.Error(err)
		}
		got <- string(buf[:n])
	}()
	if _, err := a.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if s := <-got; s != "hello" {
		t.Fatalf("read %q", s)
	}
	b.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, err := b.Read(make([]byte, 10)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("err = %v, want the deadline", err)
	}
}

// TestNoAllocations: the point of the package is the hot path, which must
// stay free of allocations.
func TestNoAllocations(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("raw calls are made on Linux only")
	}
	a, b := pair(t)
	msg, buf := make([]byte, 200), make([]byte, 200)
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := a.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(b, buf); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per write and read, want 0", allocs)
	}
	// A pool peeks at every connection it hands out.
	for _, c := range []net.Conn{a, b} {
		allocs = testing.AllocsPerRun(1000, func() {
			if got := Peek(c); got != PeekNothing {
				t.Fatalf("Peek of %T = %v, want PeekNothing", c, got)
			}
		})
		if allocs != 0 {
			t.Fatalf("%v allocations per Peek of %T, want 0", allocs, c)
		}
	}

	// An exchange with an echoing peer: request out with
	// WriteAwaitingReply, reply in with Read.
	go func() {
		echo := make([]byte, 200)
		for {
			if _, err := io.ReadFull(a, echo); err != nil {
				return
			}
			if _, err := a.Write(echo); err != nil {
				return
			}
		}
	}()
	allocs = testing.AllocsPerRun(1000, func() {
		if _, err := WriteAwaitingReply(b, msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(b, buf); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per exchange, want 0", allocs)
	}
}

// TestWriteAwaitingReply: the call writes everything, returns only once
// the peer has answered, closed, or the read deadline has passed, and
// leaves the answer (or the reason there is none) to the next Read.
func TestWriteAwaitingReply(t *testing.T) {
	tests := []struct {
		name    string
		size    int // request bytes
		sndbuf  int // the writer's socket send buffer; 0 leaves the default
		peer    func(net.Conn)
		wantErr error // from the Read after the call
		reply   string
		pending bool // the call is still waiting after the peer read the request
	}{
		{name: "reply", size: 100, peer: func(c net.Conn) { c.Write([]byte("answer")) }, reply: "answer", pending: true},
		{name: "peer closes", size: 100, peer: func(c net.Conn) { c.Close() }, wantErr: io.EOF, pending: true},
		{name: "read deadline", size: 100, peer: func(net.Conn) {}, wantErr: os.ErrDeadlineExceeded, pending: true},
		// More than the socket takes at once: the rest goes through Write.
		{name: "no room", size: 60 << 10, sndbuf: 4 << 10, peer: func(c net.Conn) { c.Write([]byte("answer")) }, reply: "answer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := pair(t)
			if tt.sndbuf > 0 {
				b.(interface{ SetWriteBuffer(int) error }).SetWriteBuffer(tt.sndbuf)
			}
			if tt.wantErr == os.ErrDeadlineExceeded {
				b.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			}
			req := bytes.Repeat([]byte("r"), tt.size)
			type result struct {
				n   int
				err error
			}
			done := make(chan result, 1)
			go func() {
				n, err := WriteAwaitingReply(b, req)
				done <- result{n, err}
			}()
			got := make([]byte, tt.size)
			if _, err := io.ReadFull(a, got); err != nil || !bytes.Equal(got, req) {
				t.Fatalf("peer read %d bytes, err %v", len(got), err)
			}
			if tt.pending && runtime.GOOS == "linux" {
				select {
				case r := <-done:
					t.Fatalf("returned (%d, %v) before the peer answered", r.n, r.err)
				case <-time.After(20 * time.Millisecond):
				}
			}
			tt.peer(a)
			r := <-done
			if r.n != len(req) || r.err != nil {
				t.Fatalf("WriteAwaitingReply = %d, %v; want %d, nil", r.n, r.err, len(req))
			}
			buf := make([]byte, 16)
			n, err := b.Read(buf)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Read after the call: %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil || string(buf[:n]) != tt.reply {
				t.Fatalf("Read after the call: %q, %v; want %q", buf[:n], err, tt.reply)
			}
		})
	}
}

func TestPeek(t *testing.T) {
	tests := []struct {
		name string
		peer func(t *testing.T, c net.Conn)
		want Peeked
	}{
		{"open and quiet", func(*testing.T, net.Conn) {}, PeekNothing},
		{"sent more", func(t *testing.T, c net.Conn) {
			if _, err := c.Write([]byte("GET / HTTP/1.1\r\n")); err != nil {
				t.Fatal(err)
			}
		}, PeekData},
		{"closed", func(_ *testing.T, c net.Conn) { c.Close() }, PeekClosed},
		{"reset", func(_ *testing.T, c net.Conn) {
			c.(interface{ SetLinger(int) error }).SetLinger(0)
			c.Close()
		}, PeekClosed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := pair(t)
			tt.peer(t, b)
			// The peer's segment is on loopback, but give it the time a
			// busy machine may need to arrive.
			got := Peek(a)
			for deadline := time.Now().Add(5 * time.Second); got != tt.want && time.Now().Before(deadline); got = Peek(a) {
				time.Sleep(time.Millisecond)
			}
			if got != tt.want {
				t.Fatalf("Peek = %v, want %v", got, tt.want)
			}
			if tt.want == PeekData {
				// Nothing was consumed.
				buf := make([]byte, 64)
				n, _ := a.Read(buf)
				if string(buf[:n]) != "GET / HTTP/1.1\r\n" {
					t.Fatalf("read %q after Peek", buf[:n])
				}
			}
		})
	}
	// A passed read deadline does not make an open connection look closed.
	for _, c := range func() []net.Conn { a, b := pair(t); return []net.Conn{a, b} }() {
		c.SetReadDeadline(time.Unix(1, 0))
		if got := Peek(c); got != PeekNothing {
			t.Fatalf("Peek of %T past its read deadline = %v, want PeekNothing", c, got)
		}
	}
	a, _ := pair(t)
	a.Close()
	if got := Peek(a); got != PeekClosed {
		t.Fatalf("Peek of a connection closed here = %v, want PeekClosed", got)
	}
	p1, p2 := net.Pipe()
	defer p1.Close()
	defer p2.Close()
	if got := Peek(p2); got != PeekUnknown {
		t.Fatalf("Peek of a pipe = %v, want PeekUnknown", got)
	}
}

// BenchmarkPeek is what a pool's check of an idle connection costs before
// each reuse.
func BenchmarkPeek(b *testing.B) {
	a, _ := pair(b)
	b.ReportAllocs()
	for b.Loop() {
		if Peek(a) != PeekNothing {
			b.Fatal("peer sent something")
		}
	}
}
