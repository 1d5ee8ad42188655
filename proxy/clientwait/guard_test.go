package clientwait

import (
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/warden-dev/warden/connpool"
	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/internal/rawio"
	"github.com/warden-dev/warden/internal/testkit/fasttest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, fasttest.LeakOptions()...) }

// pair returns the server side of a loopback TCP connection, as a
// listener would hand it to the proxy, and the client side.
func pair(t *testing.T) (server, client net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	server = rawio.Wrap(server)
	t.Cleanup(func() { server.Close(); client.Close() })
	return server, client
}

func TestGuard(t *testing.T) {
	abandoned := &connpool.Error{Kind: connpool.KindClient, Op: "wait for the response from", Err: connpool.ErrAbandoned}
	cases := []struct {
		name      string
		hangUp    bool
		err       error // what the exchange ended with
		wantGone  bool
		wantAbort bool
	}{
		{"client there", false, nil, false, false},
		{"client gone, exchange given up", true, abandoned, true, true},
		{"client gone, answer came first", true, nil, false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewFake(time.Unix(1_700_000_000, 0))
			server, client := pair(t)
			var g Guard
			var req connpool.Request
			g.Start(clk, server, &req)
			if req.Abort == nil {
				t.Fatal("Start left the request without its Abort")
			}
			if tc.hangUp {
				client.Close()
			}
			// A closed client is seen by the first check after its FIN
			// has arrived; one still there is never given up.
			fasttest.WaitFor(t, "a check", func() bool {
				clk.Advance(CheckInterval)
				return !tc.hangUp || req.Abort.Aborted()
			})
			if got := req.Abort.Aborted(); got != tc.wantAbort {
				t.Fatalf("aborted %v, want %v", got, tc.wantAbort)
			}
			if gone := g.Stop(tc.err); gone != tc.wantGone {
				t.Fatalf("Stop = %v, want %v", gone, tc.wantGone)
			}
			// The timer fires once more, finds the guard off, and stops.
			clk.Advance(CheckInterval)
			if n := clk.Timers(); n != 0 {
				t.Fatalf("%d timers armed a CheckInterval after Stop", n)
			}
		})
	}
}

// TestGuardReused: a Guard started again for the next request on the same
// clock keeps its timer, and a check left over from the last request
// looks at the current one only.
func TestGuardReused(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	var g Guard
	first, firstClient := pair(t)
	var req connpool.Request
	g.Start(clk, first, &req)
	g.Stop(nil)
	firstClient.Close()
	second, _ := pair(t)
	g.Start(clk, second, &req)
	if n := clk.Timers(); n != 1 {
		t.Fatalf("%d timers armed, want the one reused", n)
	}
	for range 3 {
		clk.Advance(CheckInterval)
	}
	if req.Abort.Aborted() {
		t.Fatal("the second request was given up for the first one's client")
	}
	if g.Stop(nil) {
		t.Fatal("Stop reports the second client gone")
	}

	// Once the timer has fired after a Stop and stopped, a Start arms it
	// again: the third request's client is watched.
	clk.Advance(CheckInterval)
	if n := clk.Timers(); n != 0 {
		t.Fatalf("%d timers armed with the guard off", n)
	}
	third, thirdClient := pair(t)
	g.Start(clk, third, &req)
	thirdClient.Close()
	fasttest.WaitFor(t, "the third client seen gone", func() bool {
		clk.Advance(CheckInterval)
		return req.Abort.Aborted()
	})
	g.Stop(nil)
}

// BenchmarkGuard is what watching its client costs a request answered
// within CheckInterval: a Start and a Stop on a reused Guard.
func BenchmarkGuard(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		b.Fatal(err)
	}
	defer server.Close()
	var g Guard
	var req connpool.Request
	clk := clock.Real{}
	g.Start(clk, server, &req)
	g.Stop(nil)
	b.ReportAllocs()
	for b.Loop() {
		g.Start(clk, server, &req)
		g.Stop(nil)
	}
}
