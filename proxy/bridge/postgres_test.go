package bridge

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/warden-dev/warden/governor/clock"
	"github.com/warden-dev/warden/policy"
)

// Twenty clients through a bridge of three: all served, and the server
// never sees more than three backends of the bridge.
func TestCapHoldsUnderConcurrency(t *testing.T) {
	h := newHarness(t, clock.Real{}, nil).withPostgres()
	h.mustApply(h.pgBridge("cap"))
	app := fmt.Sprintf("bridgecap%d", time.Now().UnixNano())
	direct := h.direct()

	var (
		done     = make(chan struct{})
		maxSeen  atomic.Int64
		samples  atomic.Int64
		waitSeen atomic.Int64
		sampler  sync.WaitGroup
	)
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		for {
			var n int64
			err := direct.QueryRow(context.Background(),
				"SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&n)
			if err != nil {
				t.Errorf("sample pg_stat_activity: %v", err)
				return
			}
			samples.Add(1)
			if n > maxSeen.Load() {
				maxSeen.Store(n)
			}
			if s := h.bridge("cap").snapshot(time.Now()); s.Waiting > 0 && s.OldestWaitSeconds > 0 {
				waitSeen.Store(1)
			}
			select {
			case <-done:
				return
			default:
			}
		}
	}()

	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			c, err := pgx.Connect(ctx, h.connString("cap", app))
			if err != nil {
				errs <- fmt.Errorf("client %d connect: %w", i, err)
				return
			}
			defer c.Close(ctx)
			for range 3 {
				var one int
				if err := c.QueryRow(ctx, "SELECT 1 FROM pg_sleep(0.02)").Scan(&one); err != nil {
					errs <- fmt.Errorf("client %d query: %w", i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(done)
	sampler.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if m := maxSeen.Load(); m > 3 || m < 1 {
		t.Errorf("pg_stat_activity showed up to %d backends for the bridge (%d samples), want 1..3", m, samples.Load())
	}
	if waitSeen.Load() == 0 {
		t.Errorf("never saw a waiting client in the snapshot")
	}
	// Their connections are kept for the next client of the same login.
	snap := h.waitFor("cap", "every session over", func(s Snapshot) bool { return s.InUse == 0 })
	if snap.Live > 3 || snap.Waiting != 0 || snap.Idle != snap.Live {
		t.Errorf("after all clients left: %+v", snap)
	}
}

// A client that waits past wait_timeout gets 53300 naming the bridge and
// the wait, whether it waits at login or (answered from the login cache)
// at its first query.
func TestWaitTimeoutIs53300(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	h := newHarness(t, clk, nil).withPostgres()
	h.mustApply(h.pgBridge("narrow", func(b *policy.Bridge) {
		b.MaxConnections = 1
		b.WaitTimeout = 5 * time.Second
	}))
	holder := h.connect("narrow", "holder")
	if _, err := holder.Exec(context.Background(), "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	check := func(t *testing.T, err error) {
		t.Helper()
		if pgCode(err) != "53300" {
			t.Fatalf("err = %v, want SQLSTATE 53300", err)
		}
		if msg := err.Error(); !strings.Contains(msg, "bridge narrow") || !strings.Contains(msg, "after waiting 5s") {
			t.Fatalf("message does not name the bridge and the wait: %s", msg)
		}
	}
	t.Run("at login", func(t *testing.T) {
		armed := clk.TimerArmed()
		res := make(chan error, 1)
		go func() {
			c, err := pgx.Connect(context.Background(), h.connString("narrow", "newcomer"))
			if err == nil {
				c.Close(context.Background())
			}
			res <- err
		}()
		<-armed
		clk.Advance(2 * time.Second)
		snap := h.bridge("narrow").snapshot(clk.Now())
		if snap.Waiting != 1 || snap.OldestWaitSeconds != 2 {
			t.Fatalf("waiting client not visible: %+v", snap)
		}
		clk.Advance(3 * time.Second)
		check(t, <-res)
	})
	t.Run("at first query", func(t *testing.T) {
		// Same login as the holder: answered from the cache at once.
		c := h.connect("narrow", "holder")
		armed := clk.TimerArmed()
		res := make(chan error, 1)
		go func() {
			_, err := c.Exec(context.Background(), "SELECT 1")
			res <- err
		}()
		<-armed
		clk.Advance(5 * time.Second)
		check(t, <-res)
	})
	var rej float64
	if mf, err := h.m.Gather(); err == nil {
		for _, f := range mf {
			if f.GetName() == "warden_rejections_total" {
				for _, m := range f.GetMetric() {
					rej += m.GetCounter().GetValue()
				}
			}
		}
	}
	if rej != 2 {
		t.Errorf("warden_rejections_total = %v, want 2", rej)
	}
}

// A client that dies inside a transaction frees its slot at once, and the
// server rolls its transaction back.
func TestClientKilledMidTransaction(t *testing.T) {
	for _, rst := range []bool{false, true} {
		t.Run(map[bool]string{false: "FIN", true: "RST"}[rst], func(t *testing.T) {
			h := newHarness(t, clock.Real{}, nil).withPostgres()
			h.mustApply(h.pgBridge("kill"))
			table := h.table()
			c := h.connect("kill", "killed")
			ctx := context.Background()
			if _, err := c.Exec(ctx, "BEGIN"); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Exec(ctx, "INSERT INTO "+table+" VALUES (1)"); err != nil {
				t.Fatal(err)
			}
			h.waitFor("kill", "the session in a transaction", func(s Snapshot) bool { return s.IdleInTransaction == 1 })
			raw := c.PgConn().Conn().(*net.TCPConn)
			if rst {
				_ = raw.SetLinger(0)
			}
			raw.Close()
			h.reaped("kill", ReasonClientGone, 1)
			if s := h.waitFor("kill", "the slot freed", func(s Snapshot) bool { return s.Live == 0 }); s.InUse != 0 {
				t.Fatalf("snapshot %+v", s)
			}
			h.rolledBack(table, 1)
		})
	}
}

// pgx cancels a running statement with a CancelRequest through the bridge.
func TestCancelRequestThroughBridge(t *testing.T) {
	h := newHarness(t, clock.Real{}, nil).withPostgres()
	h.mustApply(h.pgBridge("cancel"))
	cfg, err := pgx.ParseConfig(h.connString("cancel", "canceller"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: 20 * time.Second}
	}
	c, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = c.Exec(ctx, "SELECT pg_sleep(30)")
	if pgCode(err) != "57014" {
		t.Fatalf("err = %v, want 57014 query_canceled", err)
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Fatalf("cancel took %s", d)
	}
	// The session survives its cancelled statement.
	if _, err := c.Exec(context.Background(), "SELECT 1"); err != nil {
		t.Fatal(err)
	}

	// A cancel key the bridge did not issue is dropped: the statement runs on.
	bogus := h.dialRaw("cancel")
	req, _ := (&pgproto3.CancelRequest{ProcessID: 1, SecretKey: []byte{1, 2, 3, 4}}).Encode(nil)
	res := make(chan error, 1)
	go func() {
		_, err := c.Exec(context.Background(), "SELECT pg_sleep(0.3)")
		res <- err
	}()
	if _, err := bogus.c.Write(req); err != nil {
		t.Fatal(err)
	}
	bogus.closed()
	if err := <-res; err != nil {
		t.Fatalf("statement disturbed by a bogus cancel: %v", err)
	}
}

// The bridge declines TLS with 'N'; pgx with sslmode=prefer then connects
// in plain.
func TestSSLRequestDeclined(t *testing.T) {
	h := newHarness(t, clock.Real{}, nil).withPostgres()
	h.mustApply(h.pgBridge("ssl"))
	r := h.dialRaw("ssl")
	req, _ := (&pgproto3.SSLRequest{}).Encode(nil)
	if _, err := r.c.Write(req); err != nil {
		t.Fatal(err)
	}
	var b [1]byte
	if _, err := r.c.Read(b[:]); err != nil || b[0] != 'N' {
		t.Fatalf("answer %q, %v; want 'N'", b[0], err)
	}
	r.login(h.user, h.db, "after-ssl")
	if st, e := r.query("SELECT 1"); e != nil || st != 'I' {
		t.Fatalf("query after SSLRequest: %v %v", st, e)
	}

	prefer := strings.Replace(h.connString("ssl", "prefer"), "sslmode=disable", "sslmode=prefer", 1)
	c, err := pgx.Connect(context.Background(), prefer)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	if _, err := c.Exec(context.Background(), "SELECT 1"); err != nil {
		t.Fatal(err)
	}
}

// Garbage gets a protocol error and a close; it never crashes the bridge
// nor touches another client's session.
func TestGarbageGetsProtocolError(t *testing.T) {
	h := newHarness(t, clock.Real{}, nil).withPostgres()
	h.mustApply(h.pgBridge("garbage"))
	bystander := h.connect("garbage", "bystander")
	if _, err := bystander.Exec(context.Background(), "BEGIN"); err != nil {
		t.Fatal(err)
	}
	huge := binary.BigEndian.AppendUint32(nil, 1<<20)
	badVersion := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, 8), 2<<16)
	cases := []struct {
		name  string
		login bool // log in first, then send the garbage
		bytes []byte
	}{
		{"http request", false, []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")},
		{"huge startup length", false, huge},
		{"protocol 2", false, badVersion},
		{"startup without terminator", false, []byte{0, 0, 0, 12, 0, 3, 0, 0, 'u', 's', 'e', 'r'}},
		{"bad message type", true, []byte{'!', 0, 0, 0, 4}},
		{"negative length", true, []byte{'Q', 0xff, 0xff, 0xff, 0xff}},
		{"short length", true, []byte{'Q', 0, 0, 0, 2}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := h.dialRaw("garbage")
			if tc.login {
				r.login(h.user, h.db, "garbage")
			}
			if _, err := r.c.Write(tc.bytes); err != nil {
				t.Fatal(err)
			}
			e := r.fatal("08P01")
			if !strings.Contains(e.Message, "bridge garbage") {
				t.Fatalf("message %q does not name the bridge", e.Message)
			}
		})
	}
	// The bystander's transaction is intact.
	if _, err := bystander.Exec(context.Background(), "SELECT 1"); err != nil {
		t.Fatalf("bystander disturbed: %v", err)
	}
	if _, err := bystander.Exec(context.Background(), "COMMIT"); err != nil {
		t.Fatal(err)
	}
}

// A client that leaves cleanly gives its connection back: the next client
// of the same login gets the same server backend, reset by DISCARD ALL.
func TestCleanSessionsReuseConnections(t *testing.T) {
	h := newHarness(t, clock.Real{}, nil).withPostgres()
	h.mustApply(h.pgBridge("reuse"))
	ctx := context.Background()
	pidOf := func(c *pgx.Conn) int {
		var pid int
		if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			t.Fatal(err)
		}
		return pid
	}
	a := h.connect("reuse", "reuser")
	first := pidOf(a)
	if _, err := a.Exec(ctx, "CREATE TEMP TABLE scratch (x int); SET statement_timeout = '7s'"); err != nil {
		t.Fatal(err)
	}
	a.Close(ctx)
	h.waitFor("reuse", "the connection kept", func(s Snapshot) bool { return s.Kept == 1 && s.Live == 1 })

	b := h.connect("reuse", "reuser")
	if got := pidOf(b); got != first {
		t.Fatalf("second session on backend %d, want the kept %d", got, first)
	}
	var timeout string
	if err := b.QueryRow(ctx, "SHOW statement_timeout").Scan(&timeout); err != nil || timeout != "0" {
		t.Fatalf("statement_timeout = %q (%v): session state leaked", timeout, err)
	}
	if _, err := b.Exec(ctx, "SELECT * FROM scratch"); pgCode(err) != "42P01" {
		t.Fatalf("temp table leaked across sessions: %v", err)
	}
	// Another login never gets it.
	c := h.connect("reuse", "someone-else")
	if got := pidOf(c); got == first {
		t.Fatal("a different login was lent the kept connection")
	}
}

// A client answered from the login cache never has a statement run under
// server settings other than those it was told (a client told
// standard_conforming_strings on escapes strings for it). After ALTER ROLE
// ... SET, a kept connection made before is closed rather than lent to a
// client told the new settings; a client told the old ones whose new
// connection has the new ones gets a FATAL asking it to reconnect, before
// its first statement reaches the server, and the cache answers with the
// new settings from then on.
func TestCachedLoginToldTheConnectionsSettings(t *testing.T) {
	h := newHarness(t, clock.Real{}, nil).withPostgres()
	h.mustApply(h.pgBridge("settings"))
	ctx := context.Background()
	d := h.direct()
	role := fmt.Sprintf("bridge_settings_%d", time.Now().UnixNano())
	if _, err := d.Exec(ctx, "CREATE ROLE "+role+" LOGIN SUPERUSER"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), h.pgURL)
		if err == nil {
			_, _ = c.Exec(context.Background(), "DROP ROLE IF EXISTS "+role)
			c.Close(context.Background())
		}
	})
	table := h.table()
	if _, err := d.Exec(ctx, "GRANT ALL ON "+table+" TO "+role); err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(h.addr("settings"))
	connect := func() *pgx.Conn {
		c, err := pgx.Connect(ctx, fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable&application_name=settings",
			role, net.JoinHostPort(host, port), url.PathEscape(h.db)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	dateStyle := func(name string, c *pgx.Conn) string {
		t.Helper()
		var real string
		if err := c.QueryRow(ctx, "SHOW DateStyle").Scan(&real); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if told := c.PgConn().ParameterStatus("DateStyle"); told != real {
			t.Fatalf("%s: told DateStyle %q, the server uses %q", name, told, real)
		}
		return real
	}
	a := connect()
	before := dateStyle("a", a)
	after := "SQL, DMY"
	if before == after {
		after = "Postgres, DMY"
	}
	b := connect() // a second connection, so that two are kept
	dateStyle("b", b)
	a.Close(ctx)
	b.Close(ctx)
	h.waitFor("settings", "two connections kept", func(s Snapshot) bool { return s.Kept == 2 })
	if _, err := d.Exec(ctx, "ALTER ROLE "+role+" SET DateStyle = '"+after+"'"); err != nil {
		t.Fatal(err)
	}
	c := connect() // told the old settings; the kept connections have them
	if got := dateStyle("c", c); got != before {
		t.Fatalf("c on a kept connection uses %q", got)
	}
	if got := dateStyle("c2", connect()); got != before {
		t.Fatalf("c2 on a kept connection uses %q", got)
	}
	// Told the old settings too, but no kept connection is free: a new
	// one, with the new settings. Its first statement must not run.
	e := connect()
	if _, err := e.Exec(ctx, "INSERT INTO "+table+" VALUES (1)"); pgCode(err) != "28000" || !strings.Contains(err.Error(), "reconnect") {
		t.Fatalf("first statement on a connection with other settings than told: %v, want 28000 asking to reconnect", err)
	}
	var n int
	if err := d.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil || n != 0 {
		t.Fatalf("the refused statement ran: %d rows (%v)", n, err)
	}
	if got := dateStyle("f", connect()); got != after { // told the new ones now
		t.Fatalf("after reconnecting: %q", got)
	}
	c.Close(ctx) // kept, with the old settings
	// Told the new settings: the kept connection with the old ones is
	// closed rather than lent.
	if got := dateStyle("g", connect()); got != after {
		t.Fatalf("g uses %q", got)
	}
}
