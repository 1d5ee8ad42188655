package bridge

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/internal/testkit/loopback"
	"github.com/warden-dev/warden/policy"
)

// cancelRelay is a TCP relay in front of the test database that holds
// every CancelRequest until released: a cancel the bridge forwards stays
// on its way for as long as a test needs.
type cancelRelay struct {
	addr    string
	held    chan struct{} // one value per cancel being held
	release func()
}

func newCancelRelay(t *testing.T, pgAddr string) *cancelRelay {
	gate := make(chan struct{})
	var once sync.Once
	r := &cancelRelay{held: make(chan struct{}, 4), release: func() { once.Do(func() { close(gate) }) }}
	r.addr = loopback.Serve(t, func(c net.Conn) {
		var head [8]byte
		if _, err := io.ReadFull(c, head[:]); err != nil {
			return
		}
		if binary.BigEndian.Uint32(head[4:]) == cancelRequestCode {
			r.held <- struct{}{}
			<-gate
		}
		up, err := net.Dial("tcp", pgAddr)
		if err != nil {
			return
		}
		defer up.Close()
		if _, err := up.Write(head[:]); err != nil {
			return
		}
		go func() {
			_, _ = io.Copy(c, up)
			c.Close()
		}()
		_, _ = io.Copy(up, c)
	})
	// Registered after Serve's cleanup, so it runs first: Serve waits for
	// its handlers, held ones included.
	t.Cleanup(r.release)
	return r
}

func backendPID(t *testing.T, c *pgx.Conn) int {
	t.Helper()
	var pid int
	if err := c.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return pid
}

// A cancel still on its way to the server when its client terminates
// would cancel whatever the server connection runs next, for the next
// client of the login: that connection is closed, not kept.
func TestCancelInFlightKeepsNoConnection(t *testing.T) {
	h := newHarness(t, clock.Real{}, nil).withPostgres()
	relay := newCancelRelay(t, h.pgAddr)
	h.mustApply(h.pgBridge("race", func(b *policy.Bridge) { b.Upstream = relay.addr }))
	ctx := context.Background()

	a := h.connect("race", "racer")
	first := backendPID(t, a)
	cancelled := make(chan error, 1)
	go func() { cancelled <- a.PgConn().CancelRequest(ctx) }()
	select {
	case <-relay.held:
	case <-time.After(10 * time.Second):
		t.Fatal("the bridge did not forward the cancel")
	}
	a.Close(ctx)
	h.waitFor("race", "the cancelled connection closed, not kept", func(s Snapshot) bool { return s.Live == 0 && s.Kept == 0 })
	relay.release()
	if err := <-cancelled; err != nil {
		t.Fatalf("cancel request: %v", err)
	}

	b := h.connect("race", "racer")
	if got := backendPID(t, b); got == first {
		t.Fatalf("the next client was lent backend %d, which a cancel was on its way to", got)
	}
	// The late cancel's key is withdrawn: sent again, it is dropped.
	if err := a.PgConn().CancelRequest(ctx); err != nil {
		t.Fatalf("cancel request with a withdrawn key: %v", err)
	}
	select {
	case <-relay.held:
		t.Fatal("a cancel for an ended session was forwarded")
	default:
	}
}

// When the bridge closes a connection in the middle of a statement (its
// client vanished, its run ended), the statement is cancelled: closing the
// socket alone leaves it running, holding its locks, and an autocommit
// statement would still commit.
func TestAbandonedStatementIsCancelled(t *testing.T) {
	cases := []struct {
		name    string
		app     string
		abandon func(r *rawClient, runs *runs)
		reason  string
	}{
		{"client vanished", "vanishing", func(r *rawClient, _ *runs) {
			_ = r.c.(*net.TCPConn).SetLinger(0)
			r.c.Close()
		}, ReasonClientGone},
		{"run ended", "run:r1", func(_ *rawClient, runs *runs) { runs.end("r1") }, ReasonRunEnded},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tracker := newRuns("r1")
			h := newHarness(t, clock.Real{}, tracker).withPostgres()
			h.mustApply(h.pgBridge("abandon"))
			table := h.table()
			r := h.dialRaw("abandon")
			r.login(h.user, h.db, tc.app)
			stmt := fmt.Sprintf("INSERT INTO %s SELECT 1 FROM pg_sleep(60)", table)
			r.fe.Send(&pgproto3.Query{String: stmt})
			if err := r.fe.Flush(); err != nil {
				t.Fatal(err)
			}
			d := h.direct()
			running := func() int {
				var n int
				if err := d.QueryRow(context.Background(),
					"SELECT count(*) FROM pg_stat_activity WHERE query = $1 AND state = 'active'", stmt).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			waitUntil(t, "the statement running", 10*time.Second, func() bool { return running() == 1 })
			tc.abandon(r, tracker)
			h.reaped("abandon", tc.reason, 1)
			waitUntil(t, "the abandoned statement to stop", 10*time.Second, func() bool { return running() == 0 })
			var rows int
			if err := d.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&rows); err != nil {
				t.Fatal(err)
			}
			if rows != 0 {
				t.Fatalf("the abandoned statement inserted %d rows", rows)
			}
		})
	}
}

// waitUntil polls cond, which asks the database, until it holds.
func waitUntil(t *testing.T, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A server that accepts a new connection but never finishes its login
// does not hold the slot for ever: after the startup timeout the client
// gets 08006 naming the server, and the slot is free.
func TestUpstreamLoginTimeout(t *testing.T) {
	h := newHarness(t, clock.Real{}, nil).withPostgres()
	h.set.opts.StartupTimeout = 300 * time.Millisecond
	mute := loopback.Serve(t, func(c net.Conn) { _, _ = io.Copy(io.Discard, c) })
	h.mustApply(h.pgBridge("mute", func(b *policy.Bridge) { b.Upstream = mute; b.MaxConnections = 1 }))
	r := h.dialRaw("mute")
	r.fe.Send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber,
		Parameters: map[string]string{"user": h.user, "database": h.db, "application_name": "mute"}})
	if err := r.fe.Flush(); err != nil {
		t.Fatal(err)
	}
	if e := r.fatal("08006"); !strings.Contains(e.Message, mute) {
		t.Fatalf("message %q does not name the server", e.Message)
	}
	h.waitFor("mute", "the slot freed", func(s Snapshot) bool { return s.Live == 0 })
}
