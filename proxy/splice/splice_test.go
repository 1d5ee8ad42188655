package splice

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/warden-dev/warden/internal/testkit/fasttest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, fasttest.LeakOptions()...) }

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b := <-accepted
	if b == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	for _, c := range []net.Conn{a, b} {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	}
	return a.(*net.TCPConn), b.(*net.TCPConn)
}

// TestRun: the greeting goes first, bytes pass both ways, and each side's
// end of stream reaches the other; Run returns once both are done.
func TestRun(t *testing.T) {
	client, clientSide := tcpPair(t)
	upSide, up := tcpPair(t)
	var set Set
	tn := New(upSide)
	if !set.Add(tn) {
		t.Fatal("Add refused before any drain")
	}
	ran := make(chan struct{})
	go func() { defer close(ran); defer set.Remove(tn); tn.Run(clientSide, []byte("hi|")) }()

	io.WriteString(client, "to-up")
	client.CloseWrite()
	if got, err := io.ReadAll(up); err != nil || string(got) != "to-up" {
		t.Fatalf("upstream read %q %v, want to-up then the end", got, err)
	}
	io.WriteString(up, "to-client")
	up.CloseWrite()
	if got, err := io.ReadAll(client); err != nil || string(got) != "hi|to-client" {
		t.Fatalf("client read %q %v, want hi|to-client then the end", got, err)
	}
	<-ran
	if err := set.Drain(context.Background()); err != nil {
		t.Fatalf("drain with nothing open: %v", err)
	}
}

// TestDrain: a drain refuses new tunnels, waits for open ones until its
// context ends, then cuts them; a tunnel cut before Run closes its
// upstream at once.
func TestDrain(t *testing.T) {
	_, clientSide := tcpPair(t)
	upSide, up := tcpPair(t)
	var set Set
	tn := New(upSide)
	set.Add(tn)
	ran := make(chan struct{})
	go func() { defer close(ran); defer set.Remove(tn); tn.Run(clientSide, nil) }()

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := set.Drain(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("drain: %v, want the deadline", err)
	}
	<-ran
	if _, err := io.ReadAll(up); err != nil {
		t.Fatalf("upstream after the cut: %v, want its end", err)
	}
	late, lateUp := tcpPair(t)
	if set.Add(New(late)) {
		t.Fatal("Add accepted a tunnel during the drain")
	}
	cut := New(lateUp)
	cut.Close()
	cut.Run(late, []byte("never")) // returns at once, closing lateUp
}
