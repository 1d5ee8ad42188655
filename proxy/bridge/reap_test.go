package bridge

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/policy"
)

var t0 = time.Unix(1_700_000_000, 0)

func TestIdleTimeoutReapsIdleSession(t *testing.T) {
	clk := clock.NewFake(t0)
	h := newHarness(t, clk, nil).withPostgres()
	h.mustApply(h.pgBridge("idle", func(b *policy.Bridge) { b.IdleTimeout = 30 * time.Second }))
	r := h.dialRaw("idle")
	r.login(h.user, h.db, "idler")
	clk.Advance(29 * time.Second)
	if s := h.bridge("idle").snapshot(clk.Now()); s.Reaped[ReasonIdle] != 0 || s.Idle != 1 {
		t.Fatalf("reaped before idle_timeout: %+v", s)
	}
	clk.Advance(time.Second)
	e := r.fatal("57P05")
	if !strings.Contains(e.Message, "bridge idle") {
		t.Fatalf("message %q", e.Message)
	}
	h.reaped("idle", ReasonIdle, 1)
	h.waitFor("idle", "the slot freed", func(s Snapshot) bool { return s.Live == 0 })
}

// A statement that runs longer than idle_timeout is not idle.
func TestIdleTimeoutSparesRunningStatement(t *testing.T) {
	clk := clock.NewFake(t0)
	h := newHarness(t, clk, nil).withPostgres()
	h.mustApply(h.pgBridge("busy", func(b *policy.Bridge) { b.IdleTimeout = 30 * time.Second }))
	table := h.table()
	locker := h.direct()
	ctx := context.Background()
	if _, err := locker.Exec(ctx, "BEGIN; LOCK TABLE "+table+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	r := h.dialRaw("busy")
	r.login(h.user, h.db, "busyone")
	r.fe.Send(&pgproto3.Query{String: "SELECT count(*) FROM " + table})
	if err := r.fe.Flush(); err != nil {
		t.Fatal(err)
	}
	waitBlocked(t, locker, "busyone")

	armed := clk.TimerArmed()
	clk.Advance(31 * time.Second)
	<-armed // the check ran, found the session busy and re-armed
	if s := h.bridge("busy").snapshot(clk.Now()); s.Reaped[ReasonIdle] != 0 || s.InUse != 1 {
		t.Fatalf("a running statement was treated as idle: %+v", s)
	}
	if _, err := locker.Exec(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	if st, e := r.untilReady(); e != nil || st != 'I' {
		t.Fatalf("statement result: %c %v", st, e)
	}
	// Idle from now on: reaped a full idle_timeout later.
	advanceUntil(t, clk, 30*time.Second, h.until("busy", func(s Snapshot) bool { return s.Reaped[ReasonIdle] == 1 }))
	r.fatal("57P05")
}

// A statement sent with the extended protocol and Flush, no Sync yet, is
// running: PostgreSQL counts a session idle only once it has sent
// ReadyForQuery, which it does only for the Sync. None of the limits that
// wait for an idle session cuts it; each applies once the Sync is answered.
func TestFlushedStatementIsNotIdle(t *testing.T) {
	cases := []struct {
		name   string
		mod    func(*policy.Bridge)
		begin  bool          // run the statement inside a transaction
		past   time.Duration // a moment past the limit, while the statement runs
		status byte          // of the ReadyForQuery that answers the Sync
		code   string        // what the client gets once idle
		reason string
		idle   time.Duration // how long after the Sync the limit cuts (0: at once)
	}{
		{"idle_timeout", func(b *policy.Bridge) { b.IdleTimeout = 30 * time.Second },
			false, 31 * time.Second, 'I', "57P05", ReasonIdle, 30 * time.Second},
		{"idle_in_transaction_timeout", func(b *policy.Bridge) {
			b.IdleTimeout = time.Hour
			b.IdleInTransactionTimeout = 10 * time.Second
		}, true, 11 * time.Second, 'T', "25P03", ReasonIdleInTransaction, 10 * time.Second},
		// The idle_timeout only keeps a timer armed for the test to await.
		{"max_lifetime", func(b *policy.Bridge) {
			b.MaxLifetime = time.Minute
			b.IdleTimeout = time.Hour
		}, false, 61 * time.Second, 'I', "57P01", ReasonMaxLifetime, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewFake(t0)
			h := newHarness(t, clk, nil).withPostgres()
			h.mustApply(h.pgBridge("flush", tc.mod))
			table := h.table()
			locker := h.direct()
			ctx := context.Background()
			if _, err := locker.Exec(ctx, "BEGIN; LOCK TABLE "+table+" IN ACCESS EXCLUSIVE MODE"); err != nil {
				t.Fatal(err)
			}
			app := fmt.Sprintf("flusher%d", time.Now().UnixNano())
			r := h.dialRaw("flush")
			r.login(h.user, h.db, app)
			if tc.begin {
				if st, e := r.query("BEGIN"); e != nil || st != 'T' {
					t.Fatalf("begin: %c %v", st, e)
				}
			}
			r.fe.SendParse(&pgproto3.Parse{Query: "SELECT count(*) FROM " + table})
			r.fe.SendBind(&pgproto3.Bind{})
			r.fe.SendExecute(&pgproto3.Execute{})
			r.fe.Send(&pgproto3.Flush{})
			if err := r.fe.Flush(); err != nil {
				t.Fatal(err)
			}
			waitBlocked(t, locker, app)

			armed := clk.TimerArmed()
			reaped := h.until("flush", func(s Snapshot) bool { return s.Reaped[tc.reason] != 0 })
			clk.Advance(tc.past)
			select {
			case <-armed: // the check ran, found the session busy and re-armed
			case <-reaped:
				t.Fatalf("a running statement sent with Flush was reaped (%s)", tc.reason)
			case <-time.After(10 * time.Second):
				t.Fatal("the check neither reaped nor re-armed")
			}
			if s := h.bridge("flush").snapshot(clk.Now()); s.Reaped[tc.reason] != 0 || s.InUse != 1 || s.IdleInTransaction != 0 {
				t.Fatalf("a running statement sent with Flush was treated as idle: %+v", s)
			}
			if _, err := locker.Exec(ctx, "COMMIT"); err != nil {
				t.Fatal(err)
			}
			// Flush makes the server send the result without a ReadyForQuery.
			for {
				msg, err := r.fe.Receive()
				if err != nil {
					t.Fatalf("statement result: %v", err)
				}
				if e, ok := msg.(*pgproto3.ErrorResponse); ok {
					t.Fatalf("statement failed: %s %s", e.Code, e.Message)
				}
				if _, ok := msg.(*pgproto3.CommandComplete); ok {
					break
				}
			}
			// Still no ReadyForQuery: still not idle.
			if s := h.bridge("flush").snapshot(clk.Now()); s.InUse != 1 || s.IdleInTransaction != 0 {
				t.Fatalf("idle before the Sync is answered: %+v", s)
			}
			r.fe.Send(&pgproto3.Sync{})
			if err := r.fe.Flush(); err != nil {
				t.Fatal(err)
			}
			if st, e := r.untilReady(); e != nil || st != tc.status {
				t.Fatalf("sync: %c %v", st, e)
			}
			// Idle (or idle in a transaction) from the ReadyForQuery on.
			if tc.idle > 0 {
				advanceUntil(t, clk, tc.idle, h.until("flush", func(s Snapshot) bool { return s.Reaped[tc.reason] == 1 }))
			}
			r.fatal(tc.code)
			h.reaped("flush", tc.reason, 1)
		})
	}
}

// waitBlocked polls the server until the bridge's backend waits on a lock:
// proof the statement went through the bridge.
func waitBlocked(t *testing.T, direct *pgx.Conn, app string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var n int
		err := direct.QueryRow(context.Background(),
			"SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'", app).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			return
		}
		time.Sleep(5 * time.Millisecond) // the server offers no event to wait on
	}
	t.Fatal("the statement never reached the server")
}

func TestIdleInTransactionTimeoutRollsBack(t *testing.T) {
	clk := clock.NewFake(t0)
	h := newHarness(t, clk, nil).withPostgres()
	h.mustApply(h.pgBridge("iit", func(b *policy.Bridge) {
		b.IdleTimeout = time.Hour
		b.IdleInTransactionTimeout = 10 * time.Second
	}))
	table := h.table()
	r := h.dialRaw("iit")
	r.login(h.user, h.db, "forgetful")
	if st, e := r.query("BEGIN; INSERT INTO " + table + " VALUES (1)"); e != nil || st != 'T' {
		t.Fatalf("begin: %c %v", st, e)
	}
	if s := h.bridge("iit").snapshot(clk.Now()); s.IdleInTransaction != 1 || s.InUse != 1 {
		t.Fatalf("snapshot %+v", s)
	}
	clk.Advance(10 * time.Second)
	e := r.fatal("25P03")
	if !strings.Contains(e.Message, "bridge iit") || !strings.Contains(e.Message, "rolled back") {
		t.Fatalf("message %q", e.Message)
	}
	h.reaped("iit", ReasonIdleInTransaction, 1)
	h.rolledBack(table, 1)
}

func TestMaxLifetimeWaitsForIdle(t *testing.T) {
	clk := clock.NewFake(t0)
	h := newHarness(t, clk, nil).withPostgres()
	h.mustApply(h.pgBridge("life", func(b *policy.Bridge) {
		b.MaxLifetime = time.Minute
		b.IdleInTransactionTimeout = time.Hour
	}))
	r := h.dialRaw("life")
	r.login(h.user, h.db, "old")
	if st, e := r.query("BEGIN"); e != nil || st != 'T' {
		t.Fatalf("begin: %c %v", st, e)
	}
	armed := clk.TimerArmed()
	clk.Advance(time.Minute)
	<-armed // past its lifetime, in a transaction: marked, not cut
	if s := h.bridge("life").snapshot(clk.Now()); s.Reaped[ReasonMaxLifetime] != 0 || s.Live != 1 {
		t.Fatalf("cut inside a transaction: %+v", s)
	}
	if st, e := r.query("COMMIT"); e != nil || st != 'I' {
		t.Fatalf("commit: %c %v", st, e)
	}
	r.fatal("57P01") // closed the moment it went idle
	h.reaped("life", ReasonMaxLifetime, 1)

	// Idle when its lifetime ends: closed then.
	r2 := h.dialRaw("life")
	r2.login(h.user, h.db, "old2")
	clk.Advance(time.Minute)
	r2.fatal("57P01")
	h.reaped("life", ReasonMaxLifetime, 2)
}

func TestRunEndedClosesBoundSession(t *testing.T) {
	tracker := newRuns("r1", "r2")
	h := newHarness(t, clock.Real{}, tracker).withPostgres()
	h.mustApply(h.pgBridge("runs", func(b *policy.Bridge) { b.MaxConnections = 1 }))

	r := h.dialRaw("runs")
	r.login(h.user, h.db, "run:r1")
	if st, e := r.query("SELECT 1"); e != nil || st != 'I' {
		t.Fatalf("query: %c %v", st, e)
	}
	tracker.end("r1")
	e := r.fatal("57P01")
	if !strings.Contains(e.Message, "run r1 has ended") {
		t.Fatalf("message %q", e.Message)
	}
	h.reaped("runs", ReasonRunEnded, 1)

	// A client of an ended run is refused at once.
	late := h.dialRaw("runs")
	late.fe.Send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber,
		Parameters: map[string]string{"user": h.user, "database": h.db, "application_name": "run:r1"}})
	_ = late.fe.Flush()
	late.fatal("57P01")
	h.reaped("runs", ReasonRunEnded, 2)

	// An unknown run is not bound; it holds the only slot.
	other := h.connect("runs", "run:unknown")
	if _, err := other.Exec(context.Background(), "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	// A client of run r2 waits for the slot; r2 ends while it waits.
	waiting := h.dialRaw("runs")
	waiting.fe.Send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber,
		Parameters: map[string]string{"user": h.user, "database": h.db, "application_name": "run:r2"}})
	_ = waiting.fe.Flush()
	h.waitFor("runs", "the r2 client waiting", func(s Snapshot) bool { return s.Waiting == 1 })
	tracker.end("r2")
	// Counted and logged like the other run_ended reaps, naming the run.
	if e := waiting.fatal("57P01"); !strings.Contains(e.Message, "run r2 has ended") || !strings.Contains(e.Message, "bridge runs") {
		t.Fatalf("message %q", e.Message)
	}
	h.reaped("runs", ReasonRunEnded, 3)
	for _, run := range []string{"r1", "r2"} {
		if n := h.logs.count(`msg="connection reaped"`, "reason="+ReasonRunEnded, "run="+run); n == 0 {
			t.Errorf("no run_ended reap logged naming run %s", run)
		}
	}
	if _, err := other.Exec(context.Background(), "SELECT 1"); err != nil {
		t.Fatalf("unbound session disturbed: %v", err)
	}
}

// Without a tracker, run names are ignored.
func TestRunBindingOff(t *testing.T) {
	h := newHarness(t, clock.Real{}, nil).withPostgres()
	h.mustApply(h.pgBridge("unbound"))
	c := h.connect("unbound", "run:whatever")
	if _, err := c.Exec(context.Background(), "SELECT 1"); err != nil {
		t.Fatal(err)
	}
}

// advanceUntil moves the fake clock on by step until done closes. A session
// timer that fired early re-arms itself for the rest of its wait; each
// round waits for either outcome before moving the clock again.
func advanceUntil(t *testing.T, clk *clock.Fake, step time.Duration, done <-chan struct{}) {
	t.Helper()
	for range 10 {
		armed := clk.TimerArmed()
		clk.Advance(step)
		select {
		case <-done:
			return
		case <-armed:
		case <-time.After(10 * time.Second):
			t.Fatal("neither reaped nor re-armed")
		}
	}
	t.Fatalf("not done after 10 steps of %s", step)
}

// A kept upstream connection (its client gone, held for the next client of
// the same login) is reaped by idle_timeout too, and that reap is counted
// and logged like a session's.
func TestIdleTimeoutReapsKeptConnection(t *testing.T) {
	clk := clock.NewFake(t0)
	h := newHarness(t, clk, nil).withPostgres()
	h.mustApply(h.pgBridge("kept", func(b *policy.Bridge) { b.IdleTimeout = 30 * time.Second }))
	c := h.connect("kept", "keeper")
	if _, err := c.Exec(context.Background(), "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	c.Close(context.Background())
	h.waitFor("kept", "the connection kept", func(s Snapshot) bool { return s.Kept == 1 && s.Live == 1 })
	clk.Advance(30 * time.Second)
	h.reaped("kept", ReasonIdle, 1)
	h.waitFor("kept", "the kept connection closed", func(s Snapshot) bool { return s.Kept == 0 && s.Live == 0 })
}

// A session the server ends is no reap, even when the client, having read
// the server's FATAL, hangs up before the bridge sees the server close (as
// psql does after a refused login). Each case runs several times: which
// close the bridge saw first used to depend on timing.
func TestServerEndedSessionIsNoReap(t *testing.T) {
	cases := []struct {
		name string
		code string
		// start gets client r to where the server ends its session with code.
		start func(t *testing.T, h *harness, r *rawClient, app string)
	}{
		{"login to an unknown database", "3D000", func(t *testing.T, h *harness, r *rawClient, app string) {
			r.fe.Send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber,
				Parameters: map[string]string{"user": h.user, "database": "warden_no_such_db", "application_name": app}})
			if err := r.fe.Flush(); err != nil {
				t.Fatal(err)
			}
		}},
		{"backend terminated", "57P01", func(t *testing.T, h *harness, r *rawClient, app string) {
			r.login(h.user, h.db, app)
			var n int
			if err := h.direct().QueryRow(context.Background(),
				"SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&n); err != nil || n != 1 {
				t.Fatalf("terminate the bridge's backend: %d %v", n, err)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, clock.Real{}, nil).withPostgres()
			h.mustApply(h.pgBridge("ended"))
			b := h.bridge("ended")
			for i := range 8 {
				r := h.dialRaw("ended")
				tc.start(t, h, r, fmt.Sprintf("ended%d-%d", time.Now().UnixNano(), i))
				r.hangUpAfter(tc.code)
				h.waitBridge(b, "the session over", b.idleForGood, func() string { return "" })
			}
			s := b.snapshot(time.Now())
			for _, reason := range Reasons {
				if s.Reaped[reason] != 0 {
					t.Errorf("%d %s reaps counted", s.Reaped[reason], reason)
				}
			}
			if n := h.logs.count(`msg="connection reaped"`); n != 0 {
				t.Errorf("%d reaps logged", n)
			}
			if s.Live != 0 {
				t.Errorf("snapshot %+v", s)
			}
		})
	}
}
