package bridge

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/internal/testkit/loopback"
	"github.com/warden-dev/warden/policy"
)

// A changed bridge keeps its running sessions on their old settings; new
// clients get the new ones, and the cap counts both.
func TestReloadChangedBridgeDrainsGracefully(t *testing.T) {
	h := newHarness(t, clock.Real{}, nil).withPostgres()
	h.mustApply(h.pgBridge("rl", func(b *policy.Bridge) { b.MaxConnections = 2 }))
	ctx := context.Background()
	old := h.connect("rl", "before")
	if _, err := old.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	h.mustApply(h.pgBridge("rl", func(b *policy.Bridge) {
		b.MaxConnections = 1
		b.IdleInTransactionTimeout = time.Hour
	}))
	s := h.bridge("rl").snapshot(time.Now())
	if s.Max != 1 || s.Draining != 1 || s.Live != 1 {
		t.Fatalf("after reload: %+v", s)
	}
	// The old session runs on; a new client waits for the one slot.
	res := make(chan error, 1)
	go func() {
		c, err := h.connectE("rl", "after")
		if err == nil {
			_, err = c.Exec(ctx, "SELECT 1")
			c.Close(ctx)
		}
		res <- err
	}()
	h.waitFor("rl", "the new client waiting", func(s Snapshot) bool { return s.Waiting == 1 })
	if _, err := old.Exec(ctx, "COMMIT"); err != nil {
		t.Fatalf("old session cut by the reload: %v", err)
	}
	old.Close(ctx)
	if err := <-res; err != nil {
		t.Fatal(err)
	}

	// Moving the listener: the old address stops accepting at once.
	oldAddr := h.addr("rl")
	h.mustApply(h.pgBridge("rl", func(b *policy.Bridge) { b.Listen = loopback.FreeAddr(t) }))
	if c, err := net.DialTimeout("tcp", oldAddr, time.Second); err == nil {
		c.Close()
		t.Fatal("old listen address still accepts")
	}
	c := h.connect("rl", "moved")
	if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
}

// A bridge moved to another upstream serves new clients there while
// sessions on the old one run to their end.
func TestReloadNewUpstream(t *testing.T) {
	h := newHarness(t, clock.Real{}, nil)
	h.mustApply(tcpBridge("mv", echoServer(t)))
	old := h.dialTCP("mv")
	old.echo("one")
	h.mustApply(tcpBridge("mv", upstreamServer(t, "second upstream")))
	fresh := h.dialTCP("mv")
	if got, err := fresh.r.ReadString('\n'); err != nil || got != "second upstream\n" {
		t.Fatalf("new client: %q %v", got, err)
	}
	old.echo("still the first")
	if s := h.bridge("mv").snapshot(time.Now()); s.Live != 2 || s.Draining != 1 {
		t.Fatalf("snapshot %+v", s)
	}
}

// A removed bridge stops accepting and closes idle sessions; a session in a
// transaction finishes it first.
func TestReloadRemovedBridge(t *testing.T) {
	h := newHarness(t, clock.Real{}, nil).withPostgres()
	h.mustApply(h.pgBridge("rm"))
	addr := h.addr("rm")
	idle := h.dialRaw("rm")
	idle.login(h.user, h.db, "idle")
	busy := h.dialRaw("rm")
	busy.login(h.user, h.db, "busy")
	if st, e := busy.query("BEGIN"); e != nil || st != 'T' {
		t.Fatalf("begin: %c %v", st, e)
	}
	h.mustApply()
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Fatal("removed bridge still accepts")
	}
	if e := idle.fatal("57P01"); !strings.Contains(e.Message, "removed") {
		t.Fatalf("message %q", e.Message)
	}
	if st, e := busy.query("SELECT 1"); e != nil || st != 'T' {
		t.Fatalf("transaction cut: %c %v", st, e)
	}
	if st, e := busy.query("COMMIT"); e != nil || st != 'I' {
		t.Fatalf("commit: %c %v", st, e)
	}
	busy.fatal("57P01")
	idle.c.Close()
	busy.c.Close()
	h.set.mu.Lock()
	rb := h.set.retired[0]
	h.set.mu.Unlock()
	h.waitBridge(rb, "the removed bridge drained", rb.idleForGood, func() string { return "" })
	if err := h.apply(); err != nil { // forgets the drained bridge
		t.Fatal(err)
	}
	h.set.mu.Lock()
	n := len(h.set.retired)
	h.set.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d retired bridges still held", n)
	}
}

// Shutdown refuses new work, closes idle sessions, and cuts what is left
// when its context ends.
func TestShutdownCutsAfterGrace(t *testing.T) {
	h := newHarness(t, clock.Real{}, nil).withPostgres()
	h.mustApply(h.pgBridge("sd"))
	busy := h.dialRaw("sd")
	busy.login(h.user, h.db, "busy")
	if st, e := busy.query("BEGIN"); e != nil || st != 'T' {
		t.Fatalf("begin: %c %v", st, e)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := h.set.Shutdown(ctx); err == nil {
		t.Fatal("shutdown with a session in a transaction reported no cut")
	}
	busy.fatal("57P01")
	if err := h.apply(h.pgBridge("sd")); err == nil {
		t.Fatal("apply after shutdown succeeded")
	}
}

func (h *harness) connectE(name, app string) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return pgx.Connect(ctx, h.connString(name, app))
}
